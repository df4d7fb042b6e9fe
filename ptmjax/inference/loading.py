"""`ptmjax.load(path)`: a run folder, an imported model folder or a Hugging Face folder -> `LoadedModel`.

The default mesh is data parallel over all devices (MeshConfig(data=-1)):
every device holds the whole model and decodes its share of each batch's
rows, the simplest layout that uses every device and needs no model-specific
divisibility. Pass `mesh` (partitioning.make_mesh) for FSDP or tensor
parallelism; a run's logical-axis rules lay the parameters out on it.

How text becomes rows follows where the model learned (inference/rows.py):
a ptmjax run reads its task's rows (EOS after the inputs as the task's
features say); a model from Hugging Face reads text as its tokenizer
encodes it (BOS first where the model has one, EOS last for encoder-decoders;
decoder-only prompts plain and causal, as `transformers` generates).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import seqio
from flax import linen as nn
from jax.sharding import Mesh

from ptmjax import partitioning
from ptmjax.decoding.generation_ids import GenerationIds
from ptmjax.families.model_api import model_api
from ptmjax.inference.loaded_model import DEFAULT_BATCH_SIZE, LoadedModel
from ptmjax.inference.rows import RowFormat
from ptmjax.storage.model_dir import CONFIG_FILE, ModelDir

HF_CONFIG = "config.json"


def load(
    path: str, step: int | None = None, mesh: Mesh | None = None, batch_size: int = DEFAULT_BATCH_SIZE
) -> LoadedModel:
    """The model at `path` with its parameters (checkpoint `step`, default the newest) on `mesh`."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} is not a folder; pass a `ptmjax train` run, an imported model or a Hugging "
                                "Face folder")
    mesh = partitioning.make_mesh(partitioning.MeshConfig(data=-1)) if mesh is None else mesh
    if os.path.isfile(os.path.join(path, CONFIG_FILE)):
        return _load_model_dir(ModelDir(path), step, mesh, batch_size)
    if os.path.isfile(os.path.join(path, HF_CONFIG)):
        if step is not None:
            raise ValueError(f"step={step} given for the Hugging Face folder {path}, which holds one set of weights; "
                             "drop it")
        return _load_hf_dir(path, mesh, batch_size)
    raise FileNotFoundError(
        f"{path} has neither a {CONFIG_FILE} (a ptmjax run or import) nor a {HF_CONFIG} (a Hugging Face folder); "
        "pass one of those"
    )


def _load_model_dir(folder: ModelDir, step: int | None, mesh: Mesh, batch_size: int) -> LoadedModel:
    from ptmjax import gin_files
    from ptmjax.data import pipeline

    model, mesh_config = gin_files.read_model_config(folder)
    api = _generative_api(model, folder.path)
    vocabulary, ids = gin_files.folder_vocabulary(folder), gin_files.folder_generation_ids(folder)
    with jax.set_mesh(mesh):
        shardings = partitioning.logical_shardings(api.boxed_abstract_params, mesh, mesh_config.rules)
    params = folder.read_params(api.abstract_params, shardings, folder.checkpoint_step(step))
    source = f"{folder.path} (step {folder.checkpoint_step(step)})"
    if os.path.isfile(folder.generation_path):  # an import: text as its Hugging Face tokenizer encodes it
        return LoadedModel(model, params, vocabulary, ids, mesh, mesh_config.rules,
                           _hf_row_format(model, ids, vocabulary), source, batch_size)
    bindings = gin_files.read_train_bindings(folder)
    task = bindings.get("mixture_or_task_name")
    task_name = getattr(task, "name", task)
    inputs = pipeline.get_task_or_mixture(task_name).output_features.get("inputs") if task_name else None
    row_format = RowFormat(
        api.family, vocabulary.eos_id, add_eos=True if inputs is None else inputs.add_eos,
        decoder_start_id=ids.decoder_start_token_id or 0,
    )
    return LoadedModel(model, params, vocabulary, ids, mesh, mesh_config.rules, row_format, source, batch_size,
                       task_name, bindings.get("task_feature_lengths"))


def _load_hf_dir(path: str, mesh: Mesh, batch_size: int) -> LoadedModel:
    from ptmjax.convert import hf
    from ptmjax.data import tokenizer_dir

    model, numpy_params = hf.load(path)
    api = _generative_api(model, path)
    vocabulary, ids = tokenizer_dir.read_vocabulary(path), GenerationIds.from_hf_dir(path)
    rules = partitioning.DEFAULT_RULES
    with jax.set_mesh(mesh):
        shardings = partitioning.logical_shardings(api.boxed_abstract_params, mesh, rules)
    params = jax.device_put(numpy_params, shardings)
    return LoadedModel(model, params, vocabulary, ids, mesh, rules, _hf_row_format(model, ids, vocabulary),
                       f"{path} (Hugging Face)", batch_size)


def _hf_row_format(model: nn.Module, ids: GenerationIds, vocabulary: seqio.Vocabulary) -> RowFormat:
    """Text as Hugging Face tokenizers encode it for this model (see the module docstring)."""
    family = model_api(model).family
    eos = vocabulary.eos_id if ids.eos_token_id is None else ids.eos_token_id
    if family.decoder_only:
        return RowFormat(family, eos, add_eos=False, causal=True)
    return RowFormat(family, eos, bos_id=ids.bos_token_id, decoder_start_id=ids.decoder_start_token_id or 0)


def _generative_api(model: nn.Module, path: str) -> Any:
    api = model_api(model)
    if api.family.predict is None:
        raise ValueError(
            f"{path} holds a {type(model).__name__}, which does not generate text; ptmjax.load serves encoder-decoders "
            "(T5, BART) and decoder-only models (GPT-2)"
        )
    return api
