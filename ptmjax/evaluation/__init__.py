"""Evaluation: seqio metrics, the surveys' downstream benchmark tasks, rank classification, and
`evaluator.InferenceEvaluator` (a model's metrics on a task's or mixture's evaluation split)."""
