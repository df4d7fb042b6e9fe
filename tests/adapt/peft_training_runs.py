"""Training runs of each parameter-efficient method for the training and sharding tests: the Trainer with
`trainable=[its pattern]` on a tiny task, on one device or a mesh."""

from __future__ import annotations

import functools

import jax
import numpy as np
import optax
from lora_test_models import batch
from peft_test_models import MODELS

from ptmjax import partitioning
from ptmjax.adapt.adapters import ADAPTER_PARAMS, adapters
from ptmjax.adapt.p_tuning import p_tuning
from ptmjax.adapt.prefix_tuning import PREFIX_PARAMS, prefix_tuning
from ptmjax.adapt.prompt_tuning import PROMPT_PARAMS, prompt_tuning
from ptmjax.families.token_loss import LossConfig
from ptmjax.partitioning import MeshConfig
from ptmjax.training.trainer import Trainer

METHODS = {  # method: (family, model, the pattern of its parameters)
    "houlsby": ("t5", adapters(MODELS["t5"], "houlsby", bottleneck=4), ADAPTER_PARAMS),
    "pfeiffer": ("gpt2", adapters(MODELS["gpt2"], "pfeiffer", bottleneck=4), ADAPTER_PARAMS),
    "prompt": ("t5", prompt_tuning(MODELS["t5"], length=4), PROMPT_PARAMS),
    "p_tuning": ("t5", p_tuning(MODELS["t5"], length=4, hidden=16), PROMPT_PARAMS),
    "prefix": ("t5", prefix_tuning(MODELS["t5"], length=4, hidden=16), PREFIX_PARAMS),
}
TARGETS = np.array([5, 6, 7, 8, 9, 10], np.int32)  # the task: every row's targets, whatever its input
STEPS, LR = 20, 1e-1
SHARDED = MeshConfig(data=2, fsdp=2, tensor=2)


def task_batch(name: str) -> dict[str, np.ndarray]:
    """8 rows of random inputs, all with the targets TARGETS."""
    rows = {key: np.asarray(value) for key, value in batch(name, rows=8).items()}
    targets = np.broadcast_to(TARGETS, rows["decoder_target_tokens"].shape)
    decoder_inputs = np.pad(targets[:, :-1], ((0, 0), (1, 0)))
    if name == "gpt2":  # the input is the row's first token, then the targets
        decoder_inputs[:, 0] = rows["decoder_input_tokens"][:, 1]
    return {**rows, "decoder_target_tokens": targets, "decoder_input_tokens": decoder_inputs}


@functools.cache
def train(method: str, mesh_config: MeshConfig | None = None, steps: int = STEPS):
    """-> (initial params, final params, losses) of `steps` Adam steps on one batch with only the method's
    parameters trainable, on `mesh_config` (default: one device)."""
    name, model, pattern = METHODS[method]
    single_device = mesh_config is None
    mesh_config = mesh_config or MeshConfig()
    mesh = partitioning.make_mesh(mesh_config, jax.devices()[:1] if single_device else None)
    run = Trainer(model, optax.adam(LR), lambda _: LR, mesh, mesh_config.rules, LossConfig(z_loss=0.0),
                  trainable=[pattern])
    state = run.init_state(jax.random.key(0))
    initial = jax.device_get(state.params)
    rows = partitioning.global_batch(task_batch(name), mesh)
    losses = []
    for step in range(steps):
        state, metrics = run.train_step(state, rows, jax.random.key(step))
        losses.append(float(metrics["loss"]))
    return initial, jax.device_get(state.params), losses
