"""Adapting a pre-trained model: which parameters train, LoRA, adapters, prompts, and probing.

Task heads are Flax modules and live with the models (ptmjax/models/), and which
parameters train is ptmjax/training/trainable.py; this package holds what is
applied on top of a model: the parameter-efficient methods, and probing/ of
frozen models.
"""
