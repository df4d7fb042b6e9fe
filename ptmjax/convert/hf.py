"""Hugging Face checkpoint directories <-> ptmjax models: `load(path)` and `save(model, params, path)`.

A directory is what `transformers` writes with `save_pretrained`: config.json
plus model.safetensors (or pytorch_model.bin, read with `weights_only=True`;
sharded checkpoints with their *.index.json too, whose shards must lie inside
the directory). The family comes from config.json's `model_type`, the
pre-training head from its `architectures`; a fine-tuning class there
(BertForSequenceClassification, GPT2ForSequenceClassification, ...) gives
the matching ptmjax task model (hf_task_heads.py), and a base-model class
(BertModel, GPT2Model, ...) the pre-training one with a fresh head (hf_base_models.py).
Reading needs only safetensors (or torch for .bin files); writing needs
transformers for the config (`pip install -e ".[hf]"`).
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import flax.linen as nn
import numpy as np

import ptmjax.convert
from ptmjax.convert import hf_base_models, hf_task_heads
from ptmjax.convert.hf_heads import Head
from ptmjax.convert.state_dict import to_numpy
from ptmjax.decoding.generation_ids import GenerationIds
from ptmjax.families.registry import family_of

SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
PYTORCH, PYTORCH_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
CONFIG_TOKEN_IDS = ("eos_token_id", "pad_token_id", "decoder_start_token_id", "bos_token_id")


def _converters() -> dict[str, tuple[ModuleType, dict[str, Head]]]:
    """model_type -> (its converter module, {HF class: Head}), from the `HEADS` of every convert/hf_*.py."""
    found = {}
    for info in pkgutil.iter_modules(ptmjax.convert.__path__):
        if info.name.startswith("hf_"):
            module = importlib.import_module(f"ptmjax.convert.{info.name}")
            found.update({model_type: (module, heads) for model_type, heads in getattr(module, "HEADS", {}).items()})
    return found


# model_type -> (the ptmjax.convert.hf_* module, {HF class: Head}); the pre-training heads only.
FAMILIES = _converters()


def head_of_config(hf_config: Mapping[str, Any]) -> tuple[ModuleType, Head]:
    """The converter and head of a config.json dict; errors name the fix."""
    model_type = hf_config.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(
            f"config.json has model_type={model_type!r}; ptmjax imports {', '.join(sorted(FAMILIES))}"
        )
    converter, heads = FAMILIES[model_type]
    declared = hf_config.get("architectures") or []
    bases = {name: base for name, base in getattr(converter, "BASE_MODELS", {}).items() if base.head in heads}
    known = [bases[name].head if name in bases else name for name in declared if name in heads or name in bases]
    if not known:
        if declared or len(heads) > 1:
            raise ValueError(
                f"config.json declares architectures {declared}; ptmjax imports {model_type} checkpoints of "
                f"{', '.join([*heads, *bases])} (the pre-training heads and base models) and the fine-tuning "
                f"classes of ptmjax.convert.hf_task_heads; export the model with one of them"
            )
        known = list(heads)
    return converter, heads[known[0]]


def head_of_model(model: nn.Module) -> tuple[ModuleType, str, Head]:
    """(converter, HF class name, head) holding exactly `model`'s parameters."""
    for model_type, (converter, heads) in FAMILIES.items():
        family = getattr(converter, "family", None)  # BERT/RoBERTa and BART/mBART share a ptmjax class
        if family is not None and type(model) is heads[next(iter(heads))].model_class:
            if family(model.config) != model_type:
                continue
        for name, head in heads.items():
            if type(model) is head.model_class and all(
                getattr(model.config, k) == v for k, v in head.config_kwargs.items()
            ):
                return converter, name, head
    known = sorted({head.model_class.__name__ for _, heads in FAMILIES.values() for head in heads.values()})
    raise ValueError(f"no Hugging Face class holds a {type(model).__name__}; ptmjax exports {', '.join(known)}")


def read_state_dict(path: str) -> dict[str, np.ndarray]:
    """The weights of a checkpoint directory as numpy arrays (bfloat16 and float16 widened to float32)."""
    files = _weight_files(path)
    state: dict[str, np.ndarray] = {}
    for file in files:
        if file.endswith(".safetensors"):
            state.update(_read_safetensors(file))
        else:
            state.update(_read_torch_file(file))
    return state


def _read_torch_file(file: str) -> dict[str, np.ndarray]:
    """A pytorch_model.bin's tensors, unpickled with torch's `weights_only=True`: a file that holds other
    objects (code, which unpickling would run) is refused in one line."""
    import pickle

    import torch

    try:
        tensors = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        detail = next((line.strip().rstrip(".") for line in str(error).splitlines() if "GLOBAL" in line or
                       "Unsupported global" in line), "")
        raise ValueError(
            f"{file} holds pickled objects other than tensors{f' ({detail})' if detail else ''}; ptmjax never "
            "unpickles them, as they can run code: get the model as model.safetensors from its source, or save it "
            "again with save_pretrained(safe_serialization=True) where you trust it"
        ) from None
    return {key: _widen(to_numpy(value)) for key, value in tensors.items()}


def _read_safetensors(file: str) -> dict[str, np.ndarray]:
    """A safetensors file's tensors; a damaged file is named in a one-line error."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(file, framework="numpy") as f:
            return {key: _widen(np.asarray(f.get_tensor(key))) for key in f.keys()}  # noqa: SIM118
    except SafetensorError as error:
        raise ValueError(
            f"{file} is not a readable safetensors file ({error}); it may be truncated: copy or save it again"
        ) from None


def _weight_files(path: str) -> list[str]:
    for single, index in ((SAFETENSORS, SAFETENSORS_INDEX), (PYTORCH, PYTORCH_INDEX)):
        if os.path.exists(os.path.join(path, single)):
            return [os.path.join(path, single)]
        if os.path.exists(os.path.join(path, index)):
            with open(os.path.join(path, index)) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            return [os.path.join(path, _shard_inside(path, index, shard)) for shard in shards]
    raise FileNotFoundError(
        f"{path} has no {SAFETENSORS}, {SAFETENSORS_INDEX}, {PYTORCH} or {PYTORCH_INDEX}; "
        "point to a directory written by transformers' save_pretrained"
    )


def _shard_inside(path: str, index: str, shard: str) -> str:
    """`shard` as the index names it, refused unless it is a relative path that stays inside the folder."""
    if os.path.isabs(shard) or os.path.normpath(shard).split(os.sep)[0] == os.pardir:
        raise ValueError(
            f"{os.path.join(path, index)} names the shard {shard!r}, outside {path}; a shard must be a file in "
            "the checkpoint folder: fix the index's weight_map or use a folder you trust"
        )
    return shard


def _widen(array: np.ndarray) -> np.ndarray:
    """bfloat16 / float16 -> float32; other dtypes unchanged."""
    if array.dtype.name in ("bfloat16", "float16"):
        return array.astype(np.float32)
    return array


def load(path: str, dtype: str = "float32", param_dtype: str = "float32") -> tuple[nn.Module, dict[str, Any]]:
    """A Hugging Face checkpoint directory -> (ptmjax model, its parameters as a tree of numpy arrays).

    The parameters are the tree `model.apply({'params': params}, ...)` takes.
    Unsupported config fields raise a ValueError naming the field.
    """
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{path} has no config.json; point to a directory written by save_pretrained")
    with open(config_path) as f:
        hf_config = json.load(f)
    if hf_task_heads.task_class_of_config(hf_config) is not None:
        model = hf_task_heads.from_hf_config(hf_config, dtype=dtype, param_dtype=param_dtype)
        return model, hf_task_heads.hf_to_params(read_state_dict(path), model)["params"]
    converter, head = head_of_config(hf_config)
    config = converter.from_hf_config(hf_config, dtype=dtype, param_dtype=param_dtype, **head.config_kwargs)
    model, state = head.model_class(config), read_state_dict(path)
    base_class = _base_class(hf_config, converter)
    if base_class is None:
        return model, converter.hf_to_params(state, config, **head.convert_kwargs)["params"]
    params = hf_base_models.with_fresh_head(
        state, converter.BASE_MODELS[base_class], base_class, model,
        lambda params: converter.params_to_hf(params, config, **head.convert_kwargs),
        lambda merged: converter.hf_to_params(merged, config, **head.convert_kwargs),
    )
    return model, params["params"]


def _base_class(hf_config: Mapping[str, Any], converter: ModuleType) -> str | None:
    """The base-model class (BertModel, ...) config.json declares, if it declares one of its family's."""
    bases = getattr(converter, "BASE_MODELS", {})
    return next((name for name in hf_config.get("architectures") or [] if name in bases), None)


def save(model: nn.Module, params: Mapping[str, Any], path: str, generation_ids: GenerationIds | None = None) -> str:
    """Writes `model` with `params` as a directory transformers loads (config.json + model.safetensors).

    `generation_ids` go into a generation_config.json, and the special token
    ids also into config.json, so that `generate` needs no token-id arguments.

    The joint `ElectraPretraining` model becomes two such directories,
    `path/generator` (ElectraForMaskedLM) and `path/discriminator`
    (ElectraForPreTraining), which hold the same embeddings. Returns the path.
    Needs transformers (`pip install -e ".[hf]"`).
    """
    from safetensors.numpy import save_file

    family = family_of(model)
    if family.parts is not None:
        for name, (part, part_params) in family.parts(model, params).items():
            save(part, part_params, os.path.join(path, name), generation_ids)
        return path
    if family.task_head is not None:
        hf_config, state = hf_task_heads.to_hf_config(model), hf_task_heads.params_to_hf(params, model)
    else:
        converter, hf_class, head = head_of_model(model)
        hf_config = converter.to_hf_config(model.config)
        hf_config.architectures = [hf_class]
        state = converter.params_to_hf(params, model.config, **head.convert_kwargs)
    os.makedirs(path, exist_ok=True)
    if generation_ids is not None:
        from transformers import GenerationConfig

        for name, value in generation_ids.to_hf().items():
            if name in CONFIG_TOKEN_IDS:  # transformers 5 refuses the generation-only ones (forced_*) there
                setattr(hf_config, name, value)
        GenerationConfig(**generation_ids.to_hf()).save_pretrained(path)
    hf_config.save_pretrained(path)
    tensors: dict[str, np.ndarray] = {}
    written: set[int] = set()
    for key, value in state.items():  # tied copies are one array: write it once, as transformers does
        if id(value) not in written:
            written.add(id(value))
            tensors[key] = np.ascontiguousarray(value)
    save_file(tensors, os.path.join(path, SAFETENSORS), metadata={"format": "pt"})
    return path
