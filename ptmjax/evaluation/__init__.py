"""Evaluation: rank classification, seqio metrics, and the surveys' downstream benchmark tasks."""
