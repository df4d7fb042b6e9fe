"""Training with the sequence split over a 'context' mesh axis equals training on one device.

Tiny GPT-2 (packed rows with a prefix-LM prefix) and T5 (packed rows, relative-position bias in both stacks)
take two SGD steps through the Trainer on the mesh of gin_configs/mesh/dp_cp.gin (data=2, context=4) and on
(data=2, context=2, tensor=2), with context_parallel_attention 'all_gather' and 'ring'; losses and parameters
must agree with the single-device run, and the self-attention layers must have gone through the
context-parallel kernel (counted as they trace).
"""

import dataclasses
import functools

import jax
import numpy as np
import optax
import pytest
from sharding_helpers import mesh_preset

from ptmjax import partitioning
from ptmjax.layers import attention
from ptmjax.models import GPT2, EncoderDecoder, GPT2Config, T5Config
from ptmjax.partitioning import CONTEXT_RULES, MeshConfig
from ptmjax.training.trainer import Trainer

T5_CONFIG = T5Config(
    vocab_size=128, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=2,
    num_decoder_layers=2, ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)
GPT2_CONFIG = GPT2Config(vocab_size=128, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=32,
                         dropout_rate=0.0, attention_dropout_rate=0.0)
BATCH, INPUTS, TARGETS, STEPS, LR = 4, 32, 16, 2, 0.5
TENSOR_MESH = MeshConfig(axes={"data": 2, "fsdp": 1, "context": 2, "tensor": 2, "expert": 1}, rules=CONTEXT_RULES)


def packed(length: int, prefix: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Rows packing two examples (cut at a row-dependent place, off the context blocks' edges) and padding."""
    cut = rng.integers(length // 4, length // 2, (BATCH, 1)) + 1
    index = np.arange(length)[None]
    segment_ids = np.where(index < cut, 1, np.where(index < length - 3, 2, 0)).astype(np.int32)
    positions = np.where(segment_ids == 2, index - cut, index) * (segment_ids > 0)
    tokens = rng.integers(2, 128, (BATCH, length)).astype(np.int32) * (segment_ids > 0)
    return {f"{prefix}_tokens": tokens, f"{prefix}_segment_ids": segment_ids,
            f"{prefix}_positions": positions.astype(np.int32)}


def decoder_fields(length: int, rng: np.random.Generator, prefix_lm: bool) -> dict[str, np.ndarray]:
    fields = packed(length, "decoder", rng)
    targets, ids = fields.pop("decoder_tokens"), fields["decoder_segment_ids"]
    same_segment = np.roll(ids, 1, axis=1) == ids
    fields.update(decoder_input_tokens=(np.roll(targets, 1, axis=1) * same_segment).astype(np.int32),
                  decoder_target_tokens=targets, decoder_loss_weights=(targets > 0).astype(np.int32))
    if prefix_lm:  # each segment's first 5 tokens are its prefix (inputs), no loss there
        prefix = (fields["decoder_positions"] < 5) & (ids > 0)
        fields.update(decoder_causal_attention=prefix.astype(np.int32),
                      decoder_loss_weights=fields["decoder_loss_weights"] * ~prefix)
    return fields


def batch_of(family: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    if family == "gpt2":
        return decoder_fields(INPUTS, rng, prefix_lm=True)
    encoder = packed(INPUTS, "encoder", rng)
    return {"encoder_input_tokens": encoder.pop("encoder_tokens"), **encoder, **decoder_fields(TARGETS, rng, False)}


@functools.lru_cache(maxsize=None)
def train(family: str, mesh_config: MeshConfig, form: str = "all_gather", single_device: bool = False):
    """Losses and parameters after STEPS SGD steps, and the forms the attention layers traced with."""
    forms = []

    def counted(query, key, value, mask, kernel_form):
        forms.append(kernel_form)
        return context_parallel_attention(query, key, value, mask, kernel_form)

    context_parallel_attention = attention.context_parallel_attention
    model = (GPT2(dataclasses.replace(GPT2_CONFIG, context_parallel_attention=form)) if family == "gpt2"
             else EncoderDecoder(dataclasses.replace(T5_CONFIG, context_parallel_attention=form)))
    mesh = partitioning.make_mesh(mesh_config, jax.devices()[:1] if single_device else None)
    trainer = Trainer(model, optax.sgd(LR), optax.constant_schedule(LR), mesh, mesh_config.rules)
    state = trainer.init_state(jax.random.key(0))
    batch = partitioning.global_batch(batch_of(family), mesh)
    losses = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention, "context_parallel_attention", counted)
        for _ in range(STEPS):
            state, metrics = trainer.train_step(state, batch, jax.random.key(1))
            losses.append(float(metrics["loss"]))
    return np.array(losses), jax.device_get(state.params), forms


# Each case compiles a train step (20-60 s on 2 shared cores): two run by default, the rest with -m slow.
CASES = [(family, mesh_name, form) for family in ("gpt2", "t5") for mesh_name in ("dp_cp", "dp_cp_tensor")
         for form in ("all_gather", "ring")]
DEFAULT = {("gpt2", "dp_cp", "ring"), ("t5", "dp_cp_tensor", "all_gather")}


@pytest.mark.parametrize("family, mesh_name, form", [
    pytest.param(*case, marks=[] if case in DEFAULT else [pytest.mark.slow]) for case in CASES])
def test_context_parallel_training_equals_one_device(family, mesh_name, form):
    want_losses, want_params, single_forms = train(family, MeshConfig(), single_device=True)
    mesh_config = mesh_preset("dp_cp") if mesh_name == "dp_cp" else TENSOR_MESH
    losses, params, forms = train(family, mesh_config, form)
    assert single_forms == [] and forms and set(forms) == {form}
    # GPT-2: one self-attention per layer; T5: the encoder's and the decoder's self-attention (not cross-attention).
    assert len(forms) % (2 if family == "gpt2" else 4) == 0
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(losses, want_losses, rtol=2e-6)
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6), params, want_params)


def test_mesh_presets_split_the_sequence():
    assert mesh_preset("cp").axis_sizes(8) == {"data": 1, "fsdp": 1, "context": 8, "tensor": 1, "expert": 1}
    assert mesh_preset("dp_cp").axis_sizes(8) == {"data": 2, "fsdp": 1, "context": 4, "tensor": 1, "expert": 1}
    assert dict(mesh_preset("cp").rules)["activation_length"] == "context"


def test_attention_dropout_is_refused_in_one_line():
    config = dataclasses.replace(GPT2_CONFIG, attention_dropout_rate=0.1)
    mesh_config = mesh_preset("dp_cp")
    mesh = partitioning.make_mesh(mesh_config)
    trainer = Trainer(GPT2(config), optax.sgd(LR), optax.constant_schedule(LR), mesh, mesh_config.rules)
    state = trainer.init_state(jax.random.key(0))
    batch = partitioning.global_batch(batch_of("gpt2"), mesh)
    with pytest.raises(ValueError, match=r"context-parallel attention has no dropout on attention probabilities but "
                                         r"'attention' has dropout_rate=0.1; set the attention dropout rate to 0"):
        trainer.train_step(state, batch, jax.random.key(1))


def test_an_unknown_form_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"GPT2Config.context_parallel_attention='rings' is unknown; use one of "
                                         r"\['all_gather', 'ring'\]\."):
        dataclasses.replace(GPT2_CONFIG, context_parallel_attention="rings")
