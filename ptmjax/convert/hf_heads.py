"""The Hugging Face classes of a family: each `convert/hf_<family>.py` declares its own as
`HEADS = {model_type: {HF class name: Head(...)}}`, the pre-training heads only, and its base-model classes
as `BASE_MODELS = {HF class name: BaseModel(...)}` (hf_base_models.py); `convert/hf.py` finds them there, so a
new family's converter is its one file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import flax.linen as nn


class Head(NamedTuple):
    """One Hugging Face class of a family: the ptmjax module it becomes, and how.

    config_kwargs: passed to `from_hf_config` on import; on export, the config
      must have these values for this class to hold exactly its parameters.
    convert_kwargs: passed to `hf_to_params` / `params_to_hf` (ELECTRA's role).
    """

    model_class: type[nn.Module]
    config_kwargs: Mapping[str, Any] = {}
    convert_kwargs: Mapping[str, Any] = {}


class BaseModel(NamedTuple):
    """A Hugging Face base-model class of a family (BertModel, ...): the backbone of `head`, a class of HEADS,
    whose keys carry `prefix` ('bert.', 'model.', '' for T5) before the base class's."""

    head: str
    prefix: str
