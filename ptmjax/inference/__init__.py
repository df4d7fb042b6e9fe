"""Generating from and scoring text with a trained, imported or Hugging Face model: `ptmjax.load(path)`."""

from ptmjax.inference.loaded_model import LoadedModel, Prediction
from ptmjax.inference.loading import load

__all__ = ["LoadedModel", "Prediction", "load"]
