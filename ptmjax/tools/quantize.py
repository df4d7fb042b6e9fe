"""`ptmjax quantize --from MODEL_DIR --to OUT_DIR`: a model folder's checkpoint quantized after training (PTQ)
into a new model folder that `ptmjax.load`, `eval`, `infer` and `inspect` read as any other.

The new folder's config.gin is the source's with the model bound as `@quantized()` of the source's model
(ptmjax/compress/quantization.py); its checkpoint, at the source's step, holds the quantized parameters (integer
kernels and their scales, the other parameters as they were); an import's tokenizer, generation ids and
sentence-transformers files come along. The parameters are quantized on a data-parallel mesh of all devices,
in one jitted program. The folder is written whole: a failed command leaves what was at OUT_DIR.
"""

from __future__ import annotations

import functools
import os
import re
import shutil

import jax

from ptmjax import gin_files, partitioning
from ptmjax.compress.quantization import LAYER_DENSES, QuantizationSettings, quantize_params, quantized
from ptmjax.convert.checkpoint import refuse_non_empty
from ptmjax.data import sentence_pooling
from ptmjax.families.model_api import model_api
from ptmjax.storage.model_dir import ModelDir
from ptmjax.storage.written_whole import written_whole

MODEL_BINDING = re.compile(r"^train\.model\s*=\s*(@\S+)\s*$", re.MULTILINE)


def quantize_folder(
    source: str, target: str, weights: str = "int8", activations: str | None = None, tile_size: int | None = None,
    targets: str = LAYER_DENSES, step: int | None = None, overwrite: bool = False,
) -> str:
    """Writes `source`'s checkpoint `step` (default: the newest) quantized as the model folder `target`; returns
    the checkpoint path."""
    folder = ModelDir(source)
    model, mesh_config = gin_files.read_model_config(folder)
    if isinstance(getattr(model, QuantizationSettings.field, None), QuantizationSettings):
        raise ValueError(f"{folder.path} holds a quantized model already; quantize its float source instead")
    settings = QuantizationSettings(weights, activations, tile_size, targets)
    q_model = quantized(model, weights, activations, tile_size, targets)
    with open(folder.config_path) as f:
        config = f.read()
    bindings = MODEL_BINDING.findall(config)
    if not bindings:
        raise ValueError(f"{folder.config_path} binds no train.model on one line (e.g. 'train.model = @GPT2()')")
    if not overwrite:
        refuse_non_empty(target, "--to", "a quantized model folder", "ptmjax quantize")
    step = folder.checkpoint_step(step)
    params = _quantized_params(folder, model, q_model, mesh_config, step)
    with written_whole(target) as staging:
        staged = ModelDir(staging)
        for name in (os.path.basename(folder.tokenizer_path), os.path.basename(folder.generation_path)):
            path = os.path.join(folder.path, name)
            copy = shutil.copytree if os.path.isdir(path) else shutil.copy2
            if os.path.exists(path):
                copy(path, os.path.join(staging, name))
        sentence_pooling.copy_pooling_files(folder.path, staging)
        with open(staged.config_path, "w") as f:
            f.write(config + _quantized_binding(bindings[-1], settings, folder.path, step))
        checkpointer = staged.checkpointer(asynchronous=False)
        checkpointer.save_params(step, params)
        checkpointer.close()
    return os.path.join(ModelDir(target).checkpoints_path, str(step))


def _quantized_params(folder: ModelDir, model, q_model, mesh_config: partitioning.MeshConfig, step: int):
    """The folder's parameters at `step`, read and quantized on a data-parallel mesh of all devices."""
    mesh = partitioning.make_mesh(partitioning.MeshConfig(data=-1))
    api, q_api = model_api(model), model_api(q_model)
    with jax.set_mesh(mesh):
        shardings = partitioning.logical_shardings(api.boxed_abstract_params, mesh, mesh_config.rules)
        q_shardings = partitioning.logical_shardings(q_api.boxed_abstract_params, mesh, mesh_config.rules)
        params = folder.read_params(api.abstract_params, shardings, step)
        return jax.jit(functools.partial(quantize_params, q_model), out_shardings=q_shardings,
                       donate_argnums=(0,))(params)


def _quantized_binding(model_binding: str, settings: QuantizationSettings, source: str, step: int) -> str:
    """The gin lines that rebind train.model to the quantized source model."""
    return "\n".join([
        "", f"# Quantized from {source} (step {step}) by `ptmjax quantize`.",
        f"quantized.model = {model_binding}",
        *(f"quantized.{name} = {getattr(settings, name)!r}" for name in ("weights", "activations", "tile_size",
                                                                          "targets")),
        "train.model = @quantized()", "",
    ])
