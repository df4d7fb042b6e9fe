"""Inspect a sharded checkpoint: restored on an 8-device mesh, and read from disk only.

Run: python experiments/inspect_sharded_checkpoint/inspect_sharded_checkpoint.py [RUN_DIR]
With no RUN_DIR (or an empty one), it first writes a small run there (a
temporary folder by default): the tiny T5 v1.1 initialised on a
data=2 x fsdp=2 x tensor=2 mesh and checkpointed, with its config.gin,
as `ptmjax train` would leave it. The `# %%` markers make it a notebook in
VS Code or Jupyter (jupytext); tests/test_inspect.py runs it top to bottom.
"""

# %% Eight emulated CPU devices (must be set before JAX starts).
import math
import os
import sys
import tempfile

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import gin  # noqa: E402
import jax  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from ptmjax import cli, partitioning  # noqa: E402
from ptmjax.checkpoints import Checkpointer  # noqa: E402
from ptmjax.inspect import format_bytes, inspect_arrays, inspect_checkpoint  # noqa: E402
from ptmjax.training.optimizers import adafactor  # noqa: E402
from ptmjax.training.schedules import rsqrt_with_warmup  # noqa: E402
from ptmjax.training.trainer import Trainer  # noqa: E402

if jax.device_count() < 8:
    raise RuntimeError(f"need 8 devices, JAX has {jax.device_count()}; run this script in a fresh Python")
console = Console(width=200)
run_dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="ptmjax_inspect_")

# %% A sharded checkpoint: tiny T5 v1.1 on data=2 x fsdp=2 x tensor=2, as a run saves it.
if not os.path.exists(os.path.join(run_dir, "config.gin")):
    gin.clear_config()
    cli.parse_gin(["models/t5_1_1_tiny.gin", "mesh/dp_fsdp_tp.gin"],
                  ["train.model = @EncoderDecoder()", "EncoderDecoder.config = @T5Config()"])
    saved_mesh = partitioning.MeshConfig()
    model = gin.get_bindings("train")["model"]
    schedule = rsqrt_with_warmup()
    trainer = Trainer(model, adafactor(schedule), schedule, partitioning.make_mesh(saved_mesh),
                      saved_mesh.rules)
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.gin"), "w") as f:
        f.write(gin.config_str())
    gin.clear_config()
    checkpointer = Checkpointer(os.path.join(run_dir, "checkpoints"))
    checkpointer.save(0, trainer.init_state(jax.random.key(0)), {"batches_consumed": 0})
    checkpointer.close()
    del trainer, checkpointer
print(f"run folder: {run_dir}")

# %% Restore it onto a different layout (FSDP over all 8 devices) and inspect the live arrays.
gin.clear_config()
cli.parse_gin([os.path.join(run_dir, "config.gin")])
model = gin.get_bindings("train")["model"]
gin.clear_config()
fsdp8 = partitioning.MeshConfig(data=1, fsdp=8)
schedule = rsqrt_with_warmup()
trainer = Trainer(model, adafactor(schedule), schedule, partitioning.make_mesh(fsdp8), fsdp8.rules)
state, _ = Checkpointer(os.path.join(run_dir, "checkpoints")).restore(
    trainer.abstract_state, trainer.state_shardings
)
live = inspect_arrays(state.params, trainer.logical_axes, title="restored on fsdp=8")
console.print(live)

# %% The same from the checkpoint's metadata alone: no array is read or placed on a device.
arrays_before = len(jax.live_arrays())
from_disk = inspect_checkpoint(run_dir, {"fsdp": 8})
assert len(jax.live_arrays()) == arrays_before, "inspect_checkpoint created arrays"
assert [r.total_bytes for r in from_disk.rows] == [r.total_bytes for r in live.rows]
assert [r.device_bytes for r in from_disk.rows] == [r.device_bytes for r in live.rows]
assert [r.spec for r in from_disk.rows] == [r.spec for r in live.rows]
print("the checkpoint's predicted fsdp=8 layout equals the restored arrays' actual layout")

# %% Bytes per device under other layouts, with optimizer state; the mesh is abstract, so 64 fits.
layouts = {
    "data=8": {"data": 8},
    "fsdp=8": {"fsdp": 8},
    "data=2, fsdp=2, tensor=2": {"data": 2, "fsdp": 2, "tensor": 2},
    "fsdp=2, tensor=4": {"fsdp": 2, "tensor": 4},
    "fsdp=64": {"fsdp": 64},
}
summary = Table(title="tiny T5 v1.1: bytes on the most loaded device (parameters + Adafactor state)")
for column in ("mesh", "devices", "params/device", "opt_state/device", "total/device", "total"):
    summary.add_column(column, justify="left" if column == "mesh" else "right")
for name, axes in layouts.items():
    table = inspect_checkpoint(run_dir, axes, include_opt_state=True)
    total = table.total()
    summary.add_row(
        name, str(math.prod(table.mesh_shape.values())),
        format_bytes(total.device_bytes - table.total("opt_state").device_bytes),
        format_bytes(table.total("opt_state").device_bytes), format_bytes(total.device_bytes),
        format_bytes(total.total_bytes),
    )
console.print(summary)
