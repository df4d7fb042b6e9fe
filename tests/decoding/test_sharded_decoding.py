"""Decoding on an 8-device mesh with the training layout equals decoding on one device."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from decoding_helpers import ENCODER_INPUTS, IDS, MODELS, PROMPT_SEGMENTS, PROMPTS, is_decoder_only, peaked_params

from ptmjax import partitioning
from ptmjax.decoding import DecodeConfig
from ptmjax.decoding.sharded import jit_predict
from ptmjax.families.model_api import model_api

CONFIGS = {
    "greedy": DecodeConfig(max_decode_length=6),
    "beam": DecodeConfig(method="beam", max_decode_length=6, num_beams=3, num_decodes=3),
    "sample": DecodeConfig(method="sample", max_decode_length=6, num_decodes=2, top_k=8),
}
MESHES = {
    "data2_fsdp2_tensor2": partitioning.MeshConfig(data=2, fsdp=2, tensor=2),
    "data2_expert4": partitioning.MeshConfig(data=2, expert=4),
}


def eight_rows(module):
    """A batch of 8 rows (divisible over the data axes): the conftest prompts, repeated."""
    take = [0, 1, 2, 0, 1, 2, 2, 1]
    if is_decoder_only(module):
        return {"decoder_input_tokens": PROMPTS[take], "decoder_segment_ids": PROMPT_SEGMENTS[take]}
    return {"encoder_input_tokens": ENCODER_INPUTS[take]}


DEFAULT_CASES = [("t5_1_1", "data2_fsdp2_tensor2", "beam"), ("gpt2", "data2_fsdp2_tensor2", "greedy"),
                 ("switch", "data2_expert4", "greedy")]
SLOW_CASES = [
    pytest.param(name, mesh, method, marks=pytest.mark.slow)
    for name, mesh in [("t5_1_1", "data2_fsdp2_tensor2"), ("gpt2", "data2_fsdp2_tensor2"), ("switch", "data2_expert4")]
    for method in CONFIGS
    if (name, mesh, method) not in DEFAULT_CASES
]


@pytest.mark.parametrize("name, mesh_name, method", DEFAULT_CASES + SLOW_CASES)
def test_sharded_decoding_equals_one_device(name, mesh_name, method):
    module, config = MODELS[name], CONFIGS[method]
    api, params, batch = model_api(module), peaked_params(module), eight_rows(module)
    mesh = partitioning.make_mesh(MESHES[mesh_name])
    rng = jax.random.key(7)
    single = jax.jit(api.predict, static_argnums=(2, 3))(params, batch, config, IDS, rng)
    run = jit_predict(api.predict, api.boxed_abstract_params, mesh, partitioning.DEFAULT_RULES, config, IDS)
    sharded = run(params, batch, rng)
    assert len(sharded.tokens.sharding.device_set) == 8
    np.testing.assert_array_equal(np.asarray(sharded.tokens), np.asarray(single.tokens))
    np.testing.assert_allclose(np.asarray(sharded.scores), np.asarray(single.scores), rtol=1e-4, atol=1e-4)


def test_a_batch_that_does_not_divide_over_the_data_axes_is_named():
    module = MODELS["t5_1_1"]
    api = model_api(module)
    mesh = partitioning.make_mesh(MESHES["data2_fsdp2_tensor2"])
    run = jit_predict(api.predict, api.boxed_abstract_params, mesh, partitioning.DEFAULT_RULES, CONFIGS["greedy"], IDS)
    with pytest.raises(ValueError, match="batch of 3 rows does not divide over the 4 data-parallel devices"):
        run(peaked_params(module), {"encoder_input_tokens": ENCODER_INPUTS})
