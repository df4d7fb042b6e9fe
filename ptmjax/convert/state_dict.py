"""Shared machinery for Hugging Face conversions: config fields, tensors to numpy, rule tables.

A rule maps one HF key to one or more ptmjax parameter paths:
`Rule(hf_key, paths, split, join)` where `split(hf_array) -> [ours, ...]`
(one per path) and `join([ours, ...]) -> hf_array` is its inverse.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import numpy as np

Params = dict[str, Any]


class Rule(NamedTuple):
    hf_key: str
    paths: tuple[tuple[str, ...], ...]
    split: Callable[[np.ndarray], Sequence[np.ndarray]]
    join: Callable[[Sequence[np.ndarray]], np.ndarray]


def one_to_one(
    hf_key: str, path: tuple[str, ...],
    to_ours: Callable[[np.ndarray], np.ndarray] = lambda w: w, to_hf: Callable[[np.ndarray], np.ndarray] = lambda w: w,
) -> Rule:
    """A rule for one HF tensor <-> one ptmjax parameter."""
    return Rule(hf_key, (path,), lambda w: [to_ours(w)], lambda ws: to_hf(ws[0]))


def field(hf_config: Any, name: str, default: Any = None) -> Any:
    """A field of a transformers config object or of its config.json dict."""
    if isinstance(hf_config, Mapping):
        return hf_config.get(name, default)
    return getattr(hf_config, name, default)


def require(hf_config: Any, family: str, name: str, allowed: Sequence[Any], default: Any) -> Any:
    """Return the field's value, raising (naming the field) unless it is one of `allowed`."""
    value = field(hf_config, name, default)
    if value not in allowed:
        raise ValueError(
            f"unsupported Hugging Face {family} {name}={value!r}; ptmjax supports {name} in {list(allowed)}."
        )
    return value


def refuse_attention_pattern(config: Any, family: str) -> None:
    """Raise when `config` has a sparse attention pattern: Hugging Face's `family` attends densely."""
    if getattr(config, "attention_pattern", None) is not None:
        raise ValueError(f"{type(config).__name__}.attention_pattern={config.attention_pattern!r} has no Hugging Face "
                         f"{family} equivalent (it attends densely); only models without a pattern can be exported.")


def to_numpy(value: Any) -> np.ndarray:
    """torch tensor (any dtype, bfloat16 widened to float32) or array-like -> numpy."""
    if hasattr(value, "detach"):
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        return value.numpy()
    return np.asarray(value)


def rules_to_params(state_dict: Mapping[str, Any], rules: Sequence[Rule], ignorable: set[str], what: str) -> Params:
    """HF state dict -> {'params': tree} of numpy arrays; KeyError names missing/unexpected keys."""
    expected = {rule.hf_key for rule in rules}
    missing = sorted(expected - set(state_dict))
    unexpected = sorted(set(state_dict) - expected - ignorable)
    if missing or unexpected:
        raise KeyError(
            f"state dict does not match {what}: missing {missing[:8]}{'...' if len(missing) > 8 else ''}, "
            f"unexpected {unexpected[:8]}{'...' if len(unexpected) > 8 else ''}; "
            "build the config with from_hf_config(hf_model.config)."
        )
    params: Params = {}
    for rule in rules:
        value = to_numpy(state_dict[rule.hf_key])
        try:
            parts = rule.split(value)
        except ValueError as err:
            raise ValueError(f"cannot convert {rule.hf_key} of shape {value.shape} for {what}: {err}") from err
        for path, part in zip(rule.paths, parts, strict=True):
            node = params
            for name in path[:-1]:
                node = node.setdefault(name, {})
            node[path[-1]] = part
    return {"params": params}


def params_to_rules(params: Params, rules: Sequence[Rule], what: str) -> dict[str, np.ndarray]:
    """ptmjax params (boxed or not, with or without the top 'params' key) -> HF state dict of numpy arrays."""
    tree = nn.meta.unbox(params)
    tree = tree.get("params", tree)
    state: dict[str, np.ndarray] = {}
    for rule in rules:
        parts = []
        for path in rule.paths:
            node = tree
            for name in path:
                if name not in node:
                    raise KeyError(f"params have no {'/'.join(path)} (needed for {rule.hf_key}); is {what} right?")
                node = node[name]
            parts.append(np.asarray(node))
        state[rule.hf_key] = np.ascontiguousarray(rule.join(parts))
    return state
