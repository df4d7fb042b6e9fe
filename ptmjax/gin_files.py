"""Finding and parsing gin files (as given, or under the repository's gin_configs/), and reading a model folder's."""

from __future__ import annotations

import os
import tokenize
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gin
from flax import linen as nn

from ptmjax import partitioning
from ptmjax.gin_suggestions import did_you_mean, explain_gin_error, model_alias
from ptmjax.model_dir import CONFIG_FILE, ModelDir

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
    mean' for misspelt names) for what gin cannot parse. Usable from notebooks as well as the CLI.
    """
    from ptmjax import configurables  # noqa: F401  (registers configurables and tasks)

    paths = [resolve_gin_file(f) for f in gin_files]
    _search_gin_configs_first()
    try:
        with gin.unlock_config():
            gin.parse_config_files_and_bindings(paths, bindings)
    except (ValueError, SyntaxError, tokenize.TokenError) as error:
        raise GinConfigError(explain_gin_error(error)) from error
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
