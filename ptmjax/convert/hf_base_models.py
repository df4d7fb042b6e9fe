"""Hugging Face base-model classes (BertModel, RobertaModel, GPT2Model, BartModel, T5Model, ...): a backbone
saved without its pre-training head, as most published encoders and every sentence-transformers model are.

Each family's converter declares `BASE_MODELS = {HF base class: BaseModel(head class, prefix)}`: the
pre-training class whose backbone the base class is, and the prefix its keys lack there ('bert.', 'model.').
A base checkpoint imports as that head class: its keys, prefixed, are read where the head class reads them;
what the head class has and the checkpoint lacks (the MLM head, BART's final_logits_bias, an untied T5
lm_head) is freshly initialised, and what the checkpoint has that the head class does not (RoBERTa's pooler)
is left out; both are printed. Exported, the folder is a head-class checkpoint, whose backbone transformers'
base class reads as it reads the original.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from ptmjax.convert.hf_heads import BaseModel

LISTED = 6  # key names printed per list


class ReadKeys(dict):
    """A state dict that records the keys read from it."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)


def with_fresh_head(
    state_dict: Mapping[str, Any], base: BaseModel, base_class: str, model: nn.Module,
    to_hf: Callable[[Any], dict[str, np.ndarray]], from_hf: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """{'params': tree} of `model` (the head class) from a base-class state dict: its keys prefixed, the rest
    from a fresh initialisation (seed 0). `to_hf` / `from_hf`: the converter's params <-> head-class state."""
    from ptmjax.families.model_api import model_api

    ours = {key if key.startswith(base.prefix) else base.prefix + key: value for key, value in state_dict.items()}
    fresh = to_hf(nn.unbox(model_api(model).init(jax.random.key(0))))
    merged = ReadKeys({**fresh, **{key: value for key, value in ours.items() if key in fresh}})
    params = from_hf(merged)
    print(f"Imported a {base_class} as a {base.head}: {len(merged.read & ours.keys())} of its arrays read")
    _print_keys("newly initialised", sorted(merged.read - ours.keys()))
    _print_keys("in the checkpoint but not in the model, left out", sorted(ours.keys() - fresh.keys()))
    return params


def _print_keys(what: str, keys: list[str]) -> None:
    if keys:
        more = f" and {len(keys) - LISTED} more" if len(keys) > LISTED else ""
        print(f"  {len(keys)} {what}: {', '.join(keys[:LISTED])}{more}")
