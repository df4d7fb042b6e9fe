"""Generating from and scoring text with a trained, imported or Hugging Face model: `ptmjax.load(path)`."""

from ptmjax.inference.loading import load
from ptmjax.inference.loaded_model import LoadedModel, Prediction

__all__ = ["LoadedModel", "Prediction", "load"]
