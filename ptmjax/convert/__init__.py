"""Checkpoint conversion between ptmjax and other frameworks (Hugging Face transformers)."""

from ptmjax.convert.hf_t5 import build_hf_model, from_hf_config, hf_to_params, params_to_hf, to_hf_config

__all__ = ["build_hf_model", "from_hf_config", "hf_to_params", "params_to_hf", "to_hf_config"]
