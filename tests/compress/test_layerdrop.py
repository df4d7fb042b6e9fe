"""LayerDrop: layers skipped in training (`layerdrop`, ptmjax/layers/layer_stack.py) and pruned for inference
(`prune_layers`, ptmjax/compress/layerdrop.py).

The reference for a pruned model is the full model in training mode, every dropout rate 0, with the other
layers forced dropped: the stack's draw is intercepted and replaced by a fixed mask, so the skipping of
`apply_layers` (a select on the drawn bools) is checked against the renumbered, physically smaller model.
"""

import contextlib
import dataclasses
import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reliability.reliability_helpers_a import assert_trees_equal

from ptmjax import partitioning
from ptmjax.compress.layerdrop import prune_layers
from ptmjax.layers.layer_stack import LayerDropDraw, scan, unscan
from ptmjax.models import (
    GPT2,
    Albert,
    AlbertConfig,
    Bart,
    BartConfig,
    Bert,
    BertConfig,
    EncoderDecoder,
    GPT2Config,
    T5Config,
)
from ptmjax.training.optimizers import adafactor
from ptmjax.training.run_spec import RunSpec

T5 = T5Config(
    vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=4, num_decoder_layers=3,
    ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)
BART = BartConfig(vocab_size=64, d_model=16, num_heads=2, num_encoder_layers=4, num_decoder_layers=3, d_ff=32,
                  max_length=16, dropout_rate=0.0)
GPT = GPT2Config(vocab_size=64, d_model=16, num_heads=2, num_layers=4, d_ff=32, max_length=16, dropout_rate=0.0,
                 attention_dropout_rate=0.0)
BERT = BertConfig(vocab_size=64, d_model=16, num_heads=2, num_layers=4, d_ff=32, max_length=16, dropout_rate=0.0,
                  attention_dropout_rate=0.0)
MODELS = {"t5": (EncoderDecoder, T5), "bart": (Bart, BART), "gpt2": (GPT2, GPT), "bert": (Bert, BERT)}
KEEP = {  # the keep-list each family is pruned by, and the layers it drops
    "t5": ({"encoder": "every_other", "decoder": [1]}, {("encoder",): [1, 3], ("decoder",): [0, 2]}),
    "bart": ({"encoder": [0, 3], "decoder": "every_other"}, {("encoder",): [1, 2], ("decoder",): [1]}),
    "gpt2": ("every_other", {(): [1, 3]}),
    "bert": ([1, 2], {(): [0, 3]}),
}


def batch_of(config, seed=0):
    rng = np.random.default_rng(seed)
    tokens = lambda length: jnp.asarray(rng.integers(2, config.vocab_size, (2, length)), jnp.int32)  # noqa: E731
    if isinstance(config, (T5Config, BartConfig)):
        return {"encoder_input_tokens": tokens(8), "decoder_input_tokens": tokens(5)}
    if isinstance(config, GPT2Config):
        return {"decoder_input_tokens": tokens(8)}
    return {"input_tokens": tokens(8)}


def logits_of(output):
    return output.mlm_logits if hasattr(output, "mlm_logits") else output


@functools.lru_cache(maxsize=None)
def params_of(name):
    module, config = MODELS[name]
    return nn.unbox(module(config).init(jax.random.key(0), **batch_of(config))["params"])


@contextlib.contextmanager
def forced_drops(dropped):
    """Within the block, each stack's LayerDrop draw gives `dropped[stack path]` (indices of dropped layers)."""

    def force(next_fun, args, kwargs, context):
        if not isinstance(context.module, LayerDropDraw):
            return next_fun(*args, **kwargs)
        mask = np.zeros(args[0], bool)
        mask[dropped.get(tuple(context.module.path[:-1]), [])] = True
        return jnp.asarray(mask)

    with nn.intercept_methods(force):
        yield


def run(module, params, batch, *, train=False, rng=0, mutable=False):
    key = jax.random.key(rng) if isinstance(rng, int) else rng
    return module.apply({"params": params}, **batch, enable_dropout=train, rngs={"dropout": key}, mutable=mutable)


@pytest.mark.parametrize("name", list(MODELS))
def test_the_pruned_model_equals_the_full_model_with_the_other_layers_skipped(name):
    module, config = MODELS[name]
    keep, dropped = KEEP[name]
    params, batch = params_of(name), batch_of(config)
    shallow, shallow_params = prune_layers(module(config), params, keep)
    depths = {path: depth - len(dropped[path]) for path, depth in config.layer_stacks().items()}
    assert shallow.config.layer_stacks() == depths
    assert shallow.config == config.with_stack_depths(depths)
    for path, gone in dropped.items():  # the kept layers, renumbered, are the full model's own
        full, pruned = params, shallow_params
        for key in path:
            full, pruned = full[key], pruned[key]
        kept = [i for i in range(config.layer_stacks()[path]) if i not in gone]
        assert sorted(k for k in pruned if k.startswith("layers_")) == [f"layers_{j}" for j in range(len(kept))]
        for j, i in enumerate(kept):
            assert_trees_equal(pruned[f"layers_{j}"], full[f"layers_{i}"])
    want = sum(x.size for x in jax.tree.leaves(params)) - sum(
        x.size for path, gone in dropped.items() for i in gone
        for x in jax.tree.leaves(functools.reduce(lambda node, key: node[key], (*path, f"layers_{i}"), params))
    )
    assert sum(x.size for x in jax.tree.leaves(shallow_params)) == want

    dropping = module(dataclasses.replace(config, layerdrop=0.5))
    with forced_drops(dropped):
        reference = logits_of(run(dropping, params, batch, train=True))
    got = logits_of(run(shallow, shallow_params, batch))
    np.testing.assert_allclose(got, reference, rtol=0, atol=1e-6)
    assert not np.allclose(logits_of(run(module(config), params, batch)), reference, atol=1e-3)  # layers did drop


def test_a_scanned_model_prunes_and_drops_as_the_unscanned_one():
    params, batch = params_of("t5"), batch_of(T5)
    keep, dropped = KEEP["t5"]
    scanned_config = T5.with_scan_layers(True)
    shallow, shallow_params = prune_layers(EncoderDecoder(T5), params, keep)
    scanned, scanned_params = prune_layers(EncoderDecoder(scanned_config), scan(params, T5), keep)
    assert scanned.config == shallow.config.with_scan_layers(True)
    assert_trees_equal(unscan(scanned_params, scanned.config), shallow_params)
    dropping = dataclasses.replace(T5, layerdrop=0.5)
    with forced_drops(dropped):
        plain = logits_of(run(EncoderDecoder(dropping), params, batch, train=True))
        rolled = logits_of(run(EncoderDecoder(dropping.with_scan_layers(True)), scan(params, T5), batch, train=True))
    # A scan's float32 rounding: this T5's scanned logits differ by 1.5e-6 without LayerDrop too (measured).
    np.testing.assert_allclose(rolled, plain, rtol=0, atol=1e-5)
    # Unforced, both layouts draw the same layers from the same rng (the draw is made before the stack runs).
    draws = [run(EncoderDecoder(c), p, batch, train=True, rng=3, mutable=["intermediates"])[1]["intermediates"]
             for c, p in ((dropping, params), (dropping.with_scan_layers(True), scan(params, T5)))]
    assert_trees_equal(draws[0]["encoder"]["layerdrop"], draws[1]["encoder"]["layerdrop"])
    zero = T5.with_scan_layers(True)
    np.testing.assert_allclose(run(EncoderDecoder(zero), scan(params, T5), batch, train=True),
                               run(EncoderDecoder(T5), params, batch, train=True), rtol=0, atol=1e-5)


def test_rate_zero_draws_nothing_and_no_drops_are_bit_identical_to_it():
    """Real dropout on: a rate > 0 whose draw drops nothing changes no other rng stream and no number."""
    config = dataclasses.replace(T5, dropout_rate=0.1)
    params, batch = params_of("t5"), batch_of(T5)
    plain, sown = run(EncoderDecoder(config), params, batch, train=True, mutable=["intermediates"])
    assert "layerdrop" not in sown["intermediates"]["encoder"]
    with forced_drops({}):
        undropped = run(EncoderDecoder(dataclasses.replace(config, layerdrop=0.3)), params, batch, train=True)
    np.testing.assert_array_equal(undropped, plain)
    assert not np.array_equal(run(EncoderDecoder(config), params, batch), plain)  # dropout did act


def test_the_dropped_fraction_matches_the_rate_and_each_layer_draws_for_the_whole_batch():
    rate, draws = 0.3, 300
    config = dataclasses.replace(GPT, num_layers=8, layerdrop=rate)
    model, batch = GPT2(config), batch_of(config)
    params = nn.unbox(model.init(jax.random.key(0), **batch)["params"])

    @jax.jit
    def dropped(key):
        _, sown = model.apply({"params": params}, **batch, enable_dropout=True, rngs={"dropout": key},
                              mutable=["intermediates"])
        return sown["intermediates"]["layerdrop"]["dropped"][0]

    masks = np.asarray(jax.vmap(dropped)(jax.random.split(jax.random.key(7), draws)))
    assert masks.shape == (draws, 8)  # one draw per layer and step, shared by every row
    n = masks.size
    assert abs(masks.mean() - rate) < 4 * np.sqrt(rate * (1 - rate) / n), masks.mean()
    assert np.all(np.abs(masks.mean(0) - rate) < 4 * np.sqrt(rate * (1 - rate) / draws))


@pytest.mark.parametrize("scan_layers, remat_policy", [(False, "none"), (True, "full")])
def test_a_dropped_layer_gets_zero_gradient(scan_layers, remat_policy):
    config = dataclasses.replace(T5, layerdrop=0.5, remat_policy=remat_policy, scan_layers=scan_layers)
    params, batch = params_of("t5"), batch_of(T5)
    params = scan(params, T5) if scan_layers else params
    model = EncoderDecoder(config)

    def loss(params, key):
        logits, sown = run(model, params, batch, train=True, rng=key, mutable=["intermediates"])
        return jnp.sum(jax.nn.log_softmax(logits)[..., 3]), sown["intermediates"]

    grad = jax.jit(jax.grad(loss, has_aux=True))
    for seed in range(20):  # the first step that drops some but not all encoder layers
        grads, sown = grad(params, jax.random.key(seed))
        drops = np.asarray(sown["encoder"]["layerdrop"]["dropped"][0])
        if 0 < drops.sum() < len(drops):
            break
    grads = unscan(grads, config) if scan_layers else grads
    for i, dropped in enumerate(drops):
        norms = [np.abs(np.asarray(g)).max() for g in jax.tree.leaves(grads["encoder"][f"layers_{i}"])]
        assert (max(norms) == 0) == dropped, (i, drops, norms)


@pytest.mark.slow
def test_a_sharded_layerdrop_step_equals_one_device():
    config = dataclasses.replace(T5, dropout_rate=0.1, layerdrop=0.4, decoder_layerdrop=0.6)
    results = []
    for mesh_config, devices in [(partitioning.MeshConfig(data=2, fsdp=2, tensor=2), None),
                                 (partitioning.MeshConfig(data=1), jax.devices()[:1])]:
        spec = RunSpec(model=EncoderDecoder(config), batch_size=8, task_feature_lengths={"inputs": 12, "targets": 6},
                       optimizer=adafactor, pack=False, mesh_config=mesh_config)
        trainer = spec.trainer(partitioning.make_mesh(spec.mesh_config, devices))
        rng = np.random.default_rng(0)
        state = trainer.init_state(jax.random.key(0))
        for step in range(2):
            batch = {name: rng.integers(1, T5.vocab_size, s.shape, dtype=s.dtype)
                     for name, s in spec.abstract_batch(None).items()}
            batch["decoder_loss_weights"] = np.ones_like(batch["decoder_loss_weights"])
            state, metrics = trainer.train_step(state, partitioning.global_batch(batch, trainer.mesh),
                                                jax.random.key(step + 1))
        results.append((jax.device_get(state.params), float(metrics["loss"])))
    (sharded, sharded_loss), (single, single_loss) = results
    assert sharded_loss == pytest.approx(single_loss, rel=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), sharded, single)


def test_hugging_face_bart_layerdrop_imports_and_exports():
    pytest.importorskip("transformers")
    from ptmjax.convert import hf_bart

    hf = hf_bart.to_hf_config(BART).to_dict()
    assert (hf["encoder_layerdrop"], hf["decoder_layerdrop"]) == (0.0, 0.0)
    imported = hf_bart.from_hf_config(dict(hf, encoder_layerdrop=0.1, decoder_layerdrop=0.2))
    assert (imported.layerdrop, imported.decoder_layerdrop) == (0.1, 0.2)
    assert imported.stack_layerdrop(("encoder",)) == 0.1 and imported.stack_layerdrop(("decoder",)) == 0.2
    exported = hf_bart.to_hf_config(imported)
    assert (exported.encoder_layerdrop, exported.decoder_layerdrop) == (0.1, 0.2)
    assert hf_bart.from_hf_config(exported) == imported
    both = hf_bart.from_hf_config(dict(hf, encoder_layerdrop=0.25, decoder_layerdrop=0.25))
    assert (both.layerdrop, both.decoder_layerdrop) == (0.25, None)
    assert hf_bart.to_hf_config(both).decoder_layerdrop == 0.25


@pytest.mark.parametrize("build, message", [
    (lambda: dataclasses.replace(T5, layerdrop=1.0), r"T5Config.layerdrop must be a probability in \[0, 1\), got 1.0"),
    (lambda: dataclasses.replace(BART, decoder_layerdrop=-0.1), r"BartConfig.decoder_layerdrop must be .* got -0.1"),
    (lambda: dataclasses.replace(GPT, decoder_layerdrop=0.1), "decoder_layerdrop=0.1, but this model has no decoder"),
    (lambda: dataclasses.replace(GPT, layerdrop=0.1, num_experts=4), "layerdrop=0.1 with num_experts=4"),
    (lambda: prune_layers(GPT2(GPT), params_of("gpt2"), [0, 4]), r"keep=\[0, 4\] .* layers 0 ... 3"),
    (lambda: prune_layers(GPT2(GPT), params_of("gpt2"), [2, 1]), "distinct layers in increasing order"),
    (lambda: prune_layers(GPT2(GPT), params_of("gpt2"), []), "must name at least one of its layers"),
    (lambda: prune_layers(GPT2(GPT), params_of("gpt2"), "every_third"), "keep='every_third' .* unknown"),
    (lambda: prune_layers(EncoderDecoder(T5), params_of("t5"), [0, 1]), "name them, e.g. keep={'encoder'"),
    (lambda: prune_layers(EncoderDecoder(T5), params_of("t5"), {"decoder": [0], "middle": [0]}),
     r"stacks \['middle'\], but the model's stacks are \['encoder', 'decoder'\]"),
    (lambda: prune_layers(GPT2(dataclasses.replace(GPT, num_experts=2, moe_every=2)), None, [1, 3]),
     r"layer 1 of the layer stack has {'use_moe': True} but would become layer 0"),
    (lambda: prune_layers(Albert(AlbertConfig(vocab_size=64, d_model=16, num_heads=2, num_layers=4, d_ff=32,
                                            num_layer_groups=1)), None, [0]),
     "num_layer_groups=1 shares parameters across its 4 layers"),
])
def test_bad_settings_are_refused_in_one_line(build, message):
    with pytest.raises(ValueError) as error:
        build()
    assert re.search(message, str(error.value).splitlines()[0])  # gin adds a line naming the configurable


def test_the_demo_run_file_binds_layerdrop_on_a_four_layer_t5():
    import gin

    from ptmjax import gin_files

    try:
        gin_files.parse_gin(["runs/layerdrop_demo.gin"])
        config = T5Config()
    finally:
        gin.clear_config()
    assert (config.layerdrop, config.decoder_layerdrop) == (0.2, None)
    assert config.layer_stacks() == {("encoder",): 4, ("decoder",): 4}
