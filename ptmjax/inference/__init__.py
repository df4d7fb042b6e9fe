"""Generating from and scoring text, or embedding it, with a trained, imported or Hugging Face model:
`ptmjax.load(path)`."""

from ptmjax.inference.loaded_encoder import LoadedEncoder
from ptmjax.inference.loaded_model import LoadedModel, Prediction
from ptmjax.inference.loading import load

__all__ = ["LoadedEncoder", "LoadedModel", "Prediction", "load"]
