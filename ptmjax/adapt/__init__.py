"""Adapting a pre-trained model: which parameters train, LoRA, adapters, prompts, and probing.

Task heads are Flax modules and live with the models (ptmjax/models/); this
package holds what is applied on top of a model: the trainable-parameter
view the trainer optimises, and the parameter-efficient methods.
"""
