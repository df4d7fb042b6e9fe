"""`ptmjax.load(path)`: a run folder, an imported model folder or a Hugging Face folder -> `LoadedModel` (a
model that generates) or `LoadedEncoder` (an encoder: hidden states, embeddings, masked-token predictions).

The default mesh is data parallel over all devices (MeshConfig(data=-1)):
every device holds the whole model and decodes its share of each batch's
rows, the simplest layout that uses every device and needs no model-specific
divisibility. Pass `mesh` (partitioning.make_mesh) for FSDP or tensor
parallelism; a run's logical-axis rules lay the parameters out on it.

How text becomes rows follows where the model learned (inference/rows.py):
a ptmjax run reads its task's rows (EOS after the inputs as the task's
features say; a Transformer-XL, whose rows are segment streams, plain causal
prompts without EOS); a model from Hugging Face reads text as its tokenizer
encodes it (BOS first where the model has one, EOS last for encoder-decoders;
decoder-only prompts plain and causal, as `transformers` generates).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import seqio
from flax import linen as nn
from jax.sharding import Mesh

from ptmjax import partitioning
from ptmjax.data import sentence_pooling
from ptmjax.decoding.generation_ids import GenerationIds
from ptmjax.families.family import Kind
from ptmjax.families.model_api import ModelApi, model_api
from ptmjax.inference.loaded_encoder import LoadedEncoder
from ptmjax.inference.loaded_model import DEFAULT_BATCH_SIZE, LoadedModel
from ptmjax.inference.rows import RowFormat
from ptmjax.storage.model_dir import CONFIG_FILE, ModelDir

HF_CONFIG = "config.json"
MODEL_MAX_LENGTH_UNSET = 10**8  # transformers writes int(1e30) for a tokenizer that sets no length


def load(
    path: str, step: int | None = None, mesh: Mesh | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
    max_input_length: int | None = None,
) -> LoadedModel | LoadedEncoder:
    """The model at `path` with its parameters (checkpoint `step`, default the newest) on `mesh`.

    max_input_length: the most ids an input may have (see `input_limit` for the default); a longer one is an
    error, or cut with `generate(..., truncate=True)`."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} is not a folder; pass a `ptmjax train` run, an imported model or a Hugging "
                                "Face folder")
    mesh = partitioning.make_mesh(partitioning.MeshConfig(data=-1)) if mesh is None else mesh
    if max_input_length is not None and (not isinstance(max_input_length, int) or max_input_length < 1):
        raise ValueError(f"max_input_length={max_input_length!r} must be a positive int (or None)")
    if os.path.isfile(os.path.join(path, CONFIG_FILE)):
        folder = ModelDir(path)
        loaded, tokenizer = _load_model_dir(folder, step, mesh, batch_size), folder.tokenizer_path
    elif os.path.isfile(os.path.join(path, HF_CONFIG)):
        if step is not None:
            raise ValueError(f"step={step} given for the Hugging Face folder {path}, which holds one set of weights; "
                             "drop it")
        loaded, tokenizer = _load_hf_dir(path, mesh, batch_size), path
    else:
        raise FileNotFoundError(
            f"{path} has neither a {CONFIG_FILE} (a ptmjax run or import) nor a {HF_CONFIG} (a Hugging Face "
            "folder); pass one of those"
        )
    limit, why = (max_input_length, "max_input_length") if max_input_length is not None else input_limit(
        loaded, tokenizer)
    return dataclasses.replace(loaded, max_input_length=limit, max_input_length_source=why)


def input_limit(model: LoadedModel | LoadedEncoder, tokenizer_path: str) -> tuple[int | None, str]:
    """The most ids an input may have, and why: a sentence-transformers folder's max_seq_length; for an
    encoder-decoder run, the inputs length it trained on; else the model_max_length of its Hugging Face tokenizer
    files, if they set one; else none (None, '')."""
    from ptmjax.data import tokenizer_dir

    sentence_length = getattr(getattr(model, "sentence_pooling", None), "max_seq_length", None)
    if sentence_length is not None:
        return int(sentence_length), "its sentence_bert_config.json's max_seq_length"
    trained = (model.task_feature_lengths or {}).get("inputs")
    if trained is not None and model.api.family.encoder_decoder:
        return int(trained), "the inputs length it trained on, train.task_feature_lengths['inputs']"
    configured = tokenizer_dir.tokenizer_config(tokenizer_path).get("model_max_length") \
        if os.path.isdir(tokenizer_path) else None
    if isinstance(configured, int) and 0 < configured < MODEL_MAX_LENGTH_UNSET:
        return configured, "its tokenizer's model_max_length"
    return None, ""


def _load_model_dir(folder: ModelDir, step: int | None, mesh: Mesh, batch_size: int) -> LoadedModel | LoadedEncoder:
    from ptmjax import gin_files
    from ptmjax.data import pipeline

    model, mesh_config = gin_files.read_model_config(folder)
    api = model_api(model)
    _check_served(api, folder.path)
    vocabulary = gin_files.folder_vocabulary(folder)
    with jax.set_mesh(mesh):
        shardings = partitioning.logical_shardings(api.boxed_abstract_params, mesh, mesh_config.rules)
    params = folder.read_params(api.abstract_params, shardings, folder.checkpoint_step(step))
    source = f"{folder.path} (step {folder.checkpoint_step(step)})"
    bindings = gin_files.read_train_bindings(folder)
    task = bindings.get("mixture_or_task_name")
    task_name = getattr(task, "name", task)
    if _is_encoder(api):
        return _with_sentence_pooling(LoadedEncoder(model, params, vocabulary, mesh, mesh_config.rules, source,
                                                    batch_size, task_name, bindings.get("task_feature_lengths")),
                                      folder.path)
    ids = gin_files.folder_generation_ids(folder)
    if os.path.isfile(folder.generation_path):  # an import (or a run from one): text as its tokenizer encodes it
        return LoadedModel(model, params, vocabulary, ids, mesh, mesh_config.rules,
                           _hf_row_format(model, ids, vocabulary), source, batch_size,
                           task_feature_lengths=bindings.get("task_feature_lengths"))
    if api.family.causal_prompts:
        row_format = RowFormat(api.family, vocabulary.eos_id, add_eos=False, causal=True)
    else:
        inputs = pipeline.get_task_or_mixture(task_name).output_features.get("inputs") if task_name else None
        row_format = RowFormat(
            api.family, vocabulary.eos_id, add_eos=True if inputs is None else inputs.add_eos,
            decoder_start_id=ids.decoder_start_token_id or 0,
        )
    return LoadedModel(model, params, vocabulary, ids, mesh, mesh_config.rules, row_format, source, batch_size,
                       task_name, bindings.get("task_feature_lengths"))


def _load_hf_dir(path: str, mesh: Mesh, batch_size: int) -> LoadedModel | LoadedEncoder:
    from ptmjax.convert import hf
    from ptmjax.data import tokenizer_dir

    model, numpy_params = hf.load(path)
    api = model_api(model)
    _check_served(api, path)
    vocabulary = tokenizer_dir.read_vocabulary(path)
    rules = partitioning.DEFAULT_RULES
    with jax.set_mesh(mesh):
        shardings = partitioning.logical_shardings(api.boxed_abstract_params, mesh, rules)
    params = jax.device_put(numpy_params, shardings)
    source = f"{path} (Hugging Face)"
    if _is_encoder(api):
        return _with_sentence_pooling(LoadedEncoder(model, params, vocabulary, mesh, rules, source, batch_size), path)
    ids = GenerationIds.from_hf_dir(path)
    return LoadedModel(model, params, vocabulary, ids, mesh, rules, _hf_row_format(model, ids, vocabulary), source,
                       batch_size)


def _hf_row_format(model: nn.Module, ids: GenerationIds, vocabulary: seqio.Vocabulary) -> RowFormat:
    """Text as Hugging Face tokenizers encode it for this model (see the module docstring)."""
    family = model_api(model).family
    eos = vocabulary.eos_id if ids.eos_token_id is None else ids.eos_token_id
    if family.decoder_only:
        return RowFormat(family, eos, add_eos=False, causal=True)
    return RowFormat(family, eos, bos_id=ids.bos_token_id, decoder_start_id=ids.decoder_start_token_id or 0)


def _with_sentence_pooling(encoder: LoadedEncoder, folder: str) -> LoadedEncoder:
    """`encoder` embedding as the folder's sentence-transformers files say, if it has them."""
    pooling = sentence_pooling.read_pooling(folder)
    return encoder if pooling is None else dataclasses.replace(encoder, sentence_pooling=pooling)


def _is_encoder(api: ModelApi) -> bool:
    """Whether the model is an encoder whose hidden states LoadedEncoder reads (its family's probed stack)."""
    return api.family.kind is Kind.ENCODER and api.family.probed_stack is not None


def _check_served(api: ModelApi, path: str) -> None:
    if api.family.predict is None and not _is_encoder(api):
        raise ValueError(
            f"{path} holds a {type(api.module).__name__}, which neither generates text nor is an encoder with hidden "
            "states to read; ptmjax.load serves encoder-decoders (T5, BART), decoder-only models (GPT-2) and "
            "encoders (BERT, RoBERTa, ALBERT, ELECTRA)"
        )
