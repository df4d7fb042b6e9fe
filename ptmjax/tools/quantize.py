"""`ptmjax quantize --from MODEL_DIR --to OUT_DIR`: a model folder's checkpoint quantized after training (PTQ)
into a new model folder that `ptmjax.load`, `eval`, `infer` and `inspect` read as any other.

The new folder (tools/derived_folder.py) binds the model as `@quantized()` of the source's model
(ptmjax/compress/quantization.py); its checkpoint holds the quantized parameters (integer kernels and their
scales, the other parameters as they were). A quantization-aware training run (`@fake_quantized()`,
ptmjax/compress/fake_quantization.py) is quantized by its own scheme, to the integers it trained with. The
parameters are quantized on a data-parallel mesh of all devices, in one jitted program.
"""

from __future__ import annotations

import dataclasses
import functools

import jax

from ptmjax import gin_files, partitioning
from ptmjax.adapt.interception import settings_of
from ptmjax.compress import fake_quantization
from ptmjax.compress.fake_quantization import FakeQuantizationSettings
from ptmjax.compress.quantization import QuantizationSettings, quantize_params, quantized
from ptmjax.families.model_api import model_api
from ptmjax.storage.model_dir import ModelDir
from ptmjax.tools.derived_folder import checkpoint_bytes, refuse_target, source_config, write_derived_folder


@dataclasses.dataclass(frozen=True)
class QuantizedFolder:
    """What `quantize_folder` wrote: the checkpoint's path, and the parameters' bytes before and after."""

    checkpoint: str
    float_bytes: int
    quantized_bytes: int
    disk_bytes: int  # the checkpoint's files


def quantize_folder(
    source: str, target: str, weights: str | None = None, activations: str | None = None,
    tile_size: int | None = None, targets: str | None = None, step: int | None = None, overwrite: bool = False,
) -> QuantizedFolder:
    """Writes `source`'s checkpoint `step` (default: the newest) quantized as the model folder `target`.

    The scheme is what is given, the rest QuantizationSettings' defaults; from a fake-quantized run, its own
    (a given setting that differs from it is refused)."""
    folder = ModelDir(source)
    model, mesh_config = gin_files.read_model_config(folder)
    if settings_of(model, QuantizationSettings) is not None:
        raise ValueError(f"{folder.path} holds a quantized model already; quantize its float source instead")
    given = {name: value for name, value in (("weights", weights), ("activations", activations),
                                             ("tile_size", tile_size), ("targets", targets)) if value is not None}
    trained = settings_of(model, FakeQuantizationSettings)
    settings = QuantizationSettings(**_scheme(trained, given, folder.path))
    if trained is not None:
        model = fake_quantization.base_model(model)
    q_model = quantized(model, settings.weights, settings.activations, settings.tile_size, settings.targets)
    config, float_binding = source_config(folder, "fake_quantized.model" if trained else "train.model")
    refuse_target(target, "a quantized model folder", "ptmjax quantize", overwrite)
    step = folder.checkpoint_step(step)
    params = _quantized_params(folder, model, q_model, mesh_config, step)
    checkpoint = write_derived_folder(folder, target, config + _quantized_binding(float_binding, settings, folder.path,
                                                                                  step), params, step)
    return QuantizedFolder(checkpoint, _bytes(model_api(model).abstract_params), _bytes(params),
                           checkpoint_bytes(checkpoint))


def _scheme(trained: FakeQuantizationSettings | None, given: dict, source: str) -> dict:
    """The scheme's settings: those `given`, or a fake-quantized run's own (`trained`)."""
    if trained is None:
        return given
    own = {field.name: getattr(trained, field.name) for field in dataclasses.fields(trained)}
    differing = {name: value for name, value in given.items() if value != own[name]}
    if differing:
        name, value = next(iter(differing.items()))
        raise ValueError(f"{source} trained with fake quantization {name}={own[name]!r}, not {value!r}; leave "
                         f"--{name} out to store the integers it trained with")
    return own


def _bytes(params) -> int:
    """The bytes of a parameter tree's arrays (int4 and uint4 at a byte each, as they are held)."""
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(params))


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
