"""Finding and parsing gin files (as given, or under the repository's gin_configs/), and reading what a model
folder's config.gin says: its model, and with its tokenizer files, its vocabulary and generation ids.

`folder_vocabulary` is gin-configurable here (not in configurables.py, which
would import this module back): binding `register_text_files_task.vocabulary =
@folder_vocabulary()` with `folder_vocabulary.path` set to an imported model
fine-tunes it on text with its own tokenizer.
"""

from __future__ import annotations

import os
import tokenize
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gin
import seqio
from flax import linen as nn

from ptmjax import partitioning
from ptmjax.data import pipeline, tokenizer_dir
from ptmjax.decoding.generation_ids import GenerationIds
from ptmjax.families.registry import family_of
from ptmjax.gin_suggestions import did_you_mean, explain_gin_error, model_alias
from ptmjax.gin_value_types import check_bound_values
from ptmjax.storage.model_dir import CONFIG_FILE, TOKENIZER, ModelDir

GIN_CONFIGS = Path(__file__).resolve().parent.parent / "gin_configs"


class GinConfigError(ValueError):
    """A gin file or binding that does not parse, or names an unknown configurable or parameter."""


def resolve_gin_file(name: str) -> str:
    """Finds a gin file as given, or under gin_configs/; suggests the closest names if missing."""
    for candidate in (Path(name), GIN_CONFIGS / name):
        if candidate.is_file():
            return str(candidate)
    known = sorted(p.relative_to(GIN_CONFIGS).as_posix() for p in GIN_CONFIGS.rglob("*.gin"))
    missing = f"gin file {name!r} not found (as given or under {GIN_CONFIGS})"
    if alias := model_alias(name, known):
        raise FileNotFoundError(f"{missing}; that model is --gin_file={alias}")
    hint = did_you_mean(name, known) or did_you_mean(Path(name).name, known)
    raise FileNotFoundError(missing + (hint or f"; known gin files: {', '.join(known)}"))


def parse_gin(gin_files: Sequence[str], bindings: Sequence[str] = ()) -> list[str]:
    """Parses gin files (found as given or under gin_configs/) and bindings.

    Registers every configurable first, so gin files need no imports; returns
    the resolved file paths. Raises GinConfigError (one line, with a 'did you
    mean' for misspelt names) for what gin cannot parse, and a ValueError for a
    value of the wrong type bound to any configurable (see `gin_value_types`).
    Usable from notebooks as well as the CLI.
    """
    from ptmjax import configurables  # noqa: F401  (registers configurables and tasks)

    paths = [resolve_gin_file(f) for f in gin_files]
    _search_gin_configs_first()
    try:
        with gin.unlock_config():
            gin.parse_config_files_and_bindings(paths, bindings)
    except (ValueError, SyntaxError, tokenize.TokenError) as error:
        raise GinConfigError(explain_gin_error(error)) from error
    check_bound_values()
    return paths


def _search_gin_configs_first() -> None:
    """Makes gin look for `include`d files under gin_configs/ before anywhere else.

    Gin tries a bare relative include such as 'runs/pretrain.gin' as a Python
    package path first, and crashes (TypeError) when a folder of that name on
    sys.path is a namespace package, e.g. a `runs/` output folder in the
    working directory under `python -m`. Its public API only appends search
    paths, so ours goes to the front of its list.
    """
    prefixes = gin.config._LOCATION_PREFIXES  # noqa: SLF001 - see the docstring
    if str(GIN_CONFIGS) in prefixes:
        prefixes.remove(str(GIN_CONFIGS))
    prefixes.insert(0, str(GIN_CONFIGS))


def read_train_bindings(folder: ModelDir) -> dict[str, Any]:
    """The `train` bindings of a model folder's config.gin, references evaluated; gin's config is left cleared."""
    if not os.path.isfile(folder.config_path):
        raise FileNotFoundError(
            f"no {CONFIG_FILE} in {folder.path}; pass the folder of a `ptmjax train` run, "
            "which saves its resolved config there"
        )
    gin.clear_config()
    try:
        parse_gin([folder.config_path])
        return gin.get_bindings("train")
    finally:
        gin.clear_config()


def read_model_config(folder: ModelDir) -> tuple[nn.Module, partitioning.MeshConfig]:
    """The `train.model` and mesh config that a model folder's config.gin binds."""
    bindings = read_train_bindings(folder)
    if "model" not in bindings:
        raise ValueError(f"{folder.config_path} binds no train.model; add e.g. 'train.model = @EncoderDecoder()'")
    return bindings["model"], bindings.get("mesh_config") or partitioning.MeshConfig()


@gin.configurable
def folder_vocabulary(path: str | ModelDir = gin.REQUIRED) -> seqio.Vocabulary:
    """A model folder's seqio vocabulary: its tokenizer/ (an import's), else the targets vocabulary of its task."""
    folder = path if isinstance(path, ModelDir) else ModelDir(path)
    if os.path.isdir(folder.tokenizer_path):
        return tokenizer_dir.read_vocabulary(folder.tokenizer_path)
    if not os.path.isfile(folder.config_path):
        raise FileNotFoundError(
            f"{folder.path} has neither a {TOKENIZER}/ folder nor a {CONFIG_FILE}; pass the folder of a `ptmjax "
            "train` run or of a `ptmjax convert --from-hf` import of a directory with tokenizer files"
        )
    task = read_train_bindings(folder).get("mixture_or_task_name")
    if task is None:
        raise ValueError(
            f"{folder.path} has no {TOKENIZER}/ folder and its {CONFIG_FILE} binds no train.mixture_or_task_name; "
            f"copy the model's Hugging Face tokenizer files into {folder.tokenizer_path}"
        )
    return pipeline.task_vocabulary(getattr(task, "name", task))


def folder_generation_ids(folder: ModelDir) -> GenerationIds:
    """The generation ids of an import's generation.json, else those of the run's vocabulary and model."""
    if os.path.isfile(folder.generation_path):
        return GenerationIds.read(folder.generation_path)
    model, _ = read_model_config(folder)
    return GenerationIds.from_vocabulary(folder_vocabulary(folder), family_of(model).encoder_decoder)
