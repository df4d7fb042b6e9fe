"""Attention-head pruning (Michel et al., 2019): head masks against a float64 NumPy attention and the unmasked
model, importance against finite differences of a NumPy loss (at ξ = 1 and with a head masked), the greedy choice
against a sort, pruning in rounds against importance recomputed at each round's masks and a hand sort, a scanned
model against its unscanned twin, the physically pruned model against the masked one (T5, BERT, GPT-2, BART),
sharded importance against one device, refusals."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax import partitioning
from ptmjax.compress.head_importance import head_importance, iterative_pruning, least_important, lowest, normalised
from ptmjax.compress.head_masks import head_masked, masks_of, with_masks
from ptmjax.compress.head_pruning import head_pruned, prune_params, zeroed_params
from ptmjax.families.model_api import model_api
from ptmjax.families.token_loss import LossConfig
from ptmjax.layers import layer_stack
from ptmjax.layers.attention import MultiHeadAttention
from ptmjax.models import GPT2, Bart, BartConfig, Bert, BertConfig, EncoderDecoder, GPT2Config, T5Config

T5 = T5Config(vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=2,
              num_decoder_layers=1, ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0)
BERT = BertConfig(vocab_size=64, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=16, dropout_rate=0.0,
                  attention_dropout_rate=0.0)
GPT = GPT2Config(vocab_size=64, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=16, dropout_rate=0.0,
                 attention_dropout_rate=0.0)
BART = BartConfig(vocab_size=64, d_model=32, num_heads=4, num_encoder_layers=1, num_decoder_layers=1, d_ff=64,
                  max_length=16, dropout_rate=0.0)
MODELS = {"t5": EncoderDecoder(T5), "bert": Bert(BERT), "gpt2": GPT2(GPT), "bart": Bart(BART)}
# heads pruned per attention: uneven across layers, self- and cross-attention, encoder and decoder
PRUNED = {
    "t5": {"encoder/layers_0/attention": (1, 3), "encoder/layers_1/attention": (0,),
           "decoder/layers_0/self_attention": (2,), "decoder/layers_0/encoder_decoder_attention": (0, 1, 3)},
    "bert": {"layers_0/attention": (0, 2, 3), "layers_1/attention": (1,)},
    "gpt2": {"layers_0/attention": (3,), "layers_1/attention": (0, 1)},
    "bart": {"encoder/layers_0/attention": (1, 2), "decoder/layers_0/self_attention": (0,),
             "decoder/layers_0/encoder_decoder_attention": (3,)},
}


def inputs(name, seed=0, batch=4):
    rng = np.random.default_rng(seed)
    tokens = lambda length: rng.integers(2, 64, (batch, length), dtype=np.int32)  # noqa: E731
    if name in ("t5", "bart"):
        return {"encoder_input_tokens": tokens(7), "decoder_input_tokens": tokens(5)}
    if name == "gpt2":
        return {"decoder_input_tokens": tokens(6)}
    return {"input_tokens": tokens(8)}


def logits(model, params, name, seed=0):
    out = model.apply({"params": params}, **inputs(name, seed))
    return np.asarray(out.mlm_logits if name == "bert" else out)


def float_params(model):
    params = nn.unbox(model_api(model).init(jax.random.key(0)))
    # biases start at zero: give every parameter a random offset so that biased heads matter too
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    noisy = [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    return jax.tree.unflatten(tree, noisy)


def zero_one_masks(pruned):
    return {path: np.array([0.0 if h in heads else 1.0 for h in range(4)], np.float32)
            for path, heads in pruned.items()}


@pytest.mark.parametrize("name", ["t5", "bert"])
def test_a_mask_of_ones_is_the_unmasked_model_bit_for_bit_and_zeros_are_zeroed_output_rows(name):
    model, params = MODELS[name], float_params(MODELS[name])
    masked = head_masked(model)
    ones = with_masks(masked, params)
    assert sorted(masks_of(ones)) == sorted(PRUNED[name])  # every attention: self and cross, encoder and decoder
    np.testing.assert_array_equal(logits(masked, ones, name), logits(model, params, name))
    zeroed = with_masks(masked, params, zero_one_masks(PRUNED[name]))
    np.testing.assert_allclose(logits(masked, zeroed, name), logits(model, zeroed_params(params, PRUNED[name]), name),
                               rtol=1e-6, atol=1e-6)


def test_masked_heads_equal_a_float64_numpy_attention():
    """BERT's attention (biased projections, logits over sqrt(head_dim), a padding bias) with a 0 / 0.5 / 1 mask."""
    b, length, embed, heads, dim = 2, 5, 12, 4, 3
    attention = MultiHeadAttention(heads, dim, use_bias=True, scale_logits=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(b, length, embed)).astype(np.float32)
    bias = np.where(np.arange(length)[None, None, None, :] < np.array([5, 3])[:, None, None, None], 0.0, -1e10)
    bias = bias.astype(np.float32)
    masked = head_masked(attention)
    params = nn.unbox(masked.init(jax.random.key(0), x, x, bias)["params"])
    params = jax.tree.map(lambda p: np.asarray(p) + rng.normal(size=p.shape).astype(np.float32) * 0.3, params)
    mask = np.array([1.0, 0.0, 0.5, 0.0], np.float32)
    params["out"]["head_mask"] = mask
    got = masked.apply({"params": params}, x, x, bias)

    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    x64 = x.astype(np.float64)
    q, k, v = (np.einsum("ble,ehd->blhd", x64, p[n]["kernel"]) + p[n]["bias"] for n in ("query", "key", "value"))
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(dim) + bias
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    context = np.einsum("bhqk,bkhd->bqhd", weights, v) * mask[:, None]
    want = np.einsum("bqhd,hde->bqe", context, p["out"]["kernel"]) + p["out"]["bias"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("masks", [{}, {"decoder/layers_0/self_attention": np.array([0.0, 1.0], np.float32)}],
                         ids=["ones", "a head masked"])
def test_importance_equals_finite_differences_of_a_numpy_loss(masks):
    """|dL/dξ| averaged over two batches against central differences (ε = 1e-2) of the mean token cross-entropy,
    computed in float64 from the masked model's logits, at ξ = 1 and with a head masked (ξ = 0) as a later round
    of iterative pruning scores."""
    model = EncoderDecoder(dataclasses.replace(T5, num_encoder_layers=1, num_heads=2))
    params = float_params(model)
    batches = []
    for seed in (1, 2):
        rows = inputs("t5", seed)
        weights = (np.random.default_rng(seed).random(rows["decoder_input_tokens"].shape) < 0.8).astype(np.int32)
        batches.append({**rows, "decoder_target_tokens": inputs("t5", seed + 10)["decoder_input_tokens"],
                        "decoder_loss_weights": weights})
    got = head_importance(model, params, batches, LossConfig(z_loss=0.0), masks)

    masked = head_masked(model)
    masked_logits = jax.jit(lambda m, batch: masked.apply(
        {"params": with_masks(masked, params, m)}, batch["encoder_input_tokens"], batch["decoder_input_tokens"]))

    def loss(masks, batch):
        out = np.asarray(masked_logits(masks, batch), np.float64)
        log_probs = out - np.log(np.exp(out - out.max(-1, keepdims=True)).sum(-1, keepdims=True)) - out.max(
            -1, keepdims=True)
        picked = np.take_along_axis(log_probs, batch["decoder_target_tokens"][..., None], -1)[..., 0]
        weights = batch["decoder_loss_weights"]
        return -(picked * weights).sum() / weights.sum()

    eps = 1e-2
    for path, scores in got.items():
        want = []
        at = masks.get(path, np.ones(2, np.float32))
        for head in range(2):
            step = {**masks, path: at + eps * np.eye(2, dtype=np.float32)[head]}
            back = {**masks, path: at - eps * np.eye(2, dtype=np.float32)[head]}
            want.append(np.mean([abs(loss(step, batch) - loss(back, batch)) / (2 * eps) for batch in batches]))
        np.testing.assert_allclose(scores, want, rtol=2e-3, atol=2e-5, err_msg=path)


def test_least_important_prunes_the_lowest_normalised_scores_and_keeps_one_head_per_attention():
    raw = {"a": np.array([3.0, 4.0, 0.0]), "b": np.array([1.0, 1.0, 1.0]), "c": np.array([0.1, 0.2, 0.3])}
    scores = normalised(raw)
    np.testing.assert_allclose(scores["a"], [0.6, 0.8, 0.0])
    np.testing.assert_allclose(scores["c"], np.array([1, 2, 3]) / np.sqrt(14))
    # sorted: a2 0.0, c0 .267, c1 .535, b* .577 (ties: b0, b1, b2), a0 0.6, c2 .802, a1 0.8
    assert least_important(scores, 1 / 9) == {"a": (2,)}
    assert least_important(scores, 4 / 9) == {"a": (2,), "b": (0,), "c": (0, 1)}
    # c's last head is skipped for the next lowest: b's
    assert least_important(scores, 5 / 9) == {"a": (2,), "b": (0, 1), "c": (0, 1)}
    assert least_important(scores, 0.0) == {}
    # heads pruned in an earlier round: NaN, out of their attention's norm and of the choice
    earlier = {"a": (2,), "c": (0, 1)}
    again = normalised(raw, earlier)
    np.testing.assert_allclose(again["a"], [0.6, 0.8, np.nan])
    np.testing.assert_allclose(again["c"], [np.nan, np.nan, 1.0])
    # left: b* .577 (b0, b1; b2 is b's last), a0 .6, a1 .8, c2 1.0 (c's last)
    assert lowest(again, 6, earlier) == {"a": (0, 2), "b": (0, 1), "c": (0, 1)}


def gpt2_batches():
    rows = inputs("gpt2", 1)
    return [{**rows, "decoder_target_tokens": inputs("gpt2", 2)["decoder_input_tokens"],
             "decoder_loss_weights": np.ones_like(rows["decoder_input_tokens"])}]


def test_one_round_is_the_one_shot_choice_bit_for_bit():
    model, batches = MODELS["gpt2"], gpt2_batches()
    params = float_params(model)
    importance = head_importance(model, params, batches)
    pruned, (only,) = iterative_pruning(model, params, batches, 0.5)
    assert pruned == only.pruned == least_important(normalised(importance), 0.5)
    for path, scores in importance.items():
        np.testing.assert_array_equal(only.importance[path], scores)
        np.testing.assert_array_equal(only.scores[path], normalised(importance)[path])


def test_each_round_scores_the_model_with_the_heads_pruned_so_far_masked():
    """GPT-2, 2 x 4 heads, half pruned in two rounds: round 2's importance is `head_importance` at zero masks on
    round 1's heads, and its choice the two lowest of the heads left, normalised over those left (a hand sort);
    here that choice differs from one shot's."""
    model, batches = MODELS["gpt2"], gpt2_batches()
    params = float_params(model)
    pruned, (first, second) = iterative_pruning(model, params, batches, 0.5, rounds=2)
    full = head_importance(model, params, batches)
    for path, scores in full.items():
        np.testing.assert_array_equal(first.importance[path], scores)
    assert first.pruned == least_important(normalised(full), 0.25)
    masked = head_importance(model, params, batches, masks=zero_one_masks(first.pruned))
    left = []
    for path, scores in masked.items():
        np.testing.assert_allclose(second.importance[path], scores, rtol=1e-6, atol=1e-9, err_msg=path)
        heads = [h for h in range(4) if h not in first.pruned.get(path, ())]
        norm = np.linalg.norm(scores[heads].astype(np.float64))
        left += [(scores[h] / norm, path, h) for h in heads]
        assert np.isnan(second.scores[path]).sum() == 4 - len(heads)
    chosen = {}
    for _, path, head in sorted(left)[:2]:
        chosen[path] = tuple(sorted((*chosen.get(path, ()), head)))
    assert second.pruned == chosen
    assert pruned == {path: tuple(sorted(first.pruned.get(path, ()) + chosen.get(path, ())))
                      for path in full if path in first.pruned or path in chosen}
    one_shot = least_important(normalised(full), 0.5)
    print("one shot", one_shot, "in two rounds", pruned)
    assert pruned != one_shot


def test_a_scanned_model_is_scored_and_pruned_as_its_unscanned_twin():
    plain, batches = MODELS["gpt2"], gpt2_batches()
    scanned = GPT2(dataclasses.replace(GPT, scan_layers=True))
    params = float_params(plain)
    got, got_rounds = iterative_pruning(scanned, layer_stack.scan(params, scanned.config), batches, 0.5, rounds=2)
    want, want_rounds = iterative_pruning(plain, params, batches, 0.5, rounds=2)
    assert got == want
    for got_round, want_round in zip(got_rounds, want_rounds, strict=True):
        assert got_round.pruned == want_round.pruned
        for path, scores in want_round.importance.items():
            np.testing.assert_allclose(got_round.importance[path], scores, rtol=1e-6, atol=1e-9, err_msg=path)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_pruned_model_equals_the_masked_model_with_smaller_kernels(name):
    model, params = MODELS[name], float_params(MODELS[name])
    masked = head_masked(model)
    want = logits(masked, with_masks(masked, params, zero_one_masks(PRUNED[name])), name)
    pruned_model = head_pruned(model, PRUNED[name])
    pruned_params = prune_params(params, PRUNED[name])
    assert jax.tree.map(jnp.shape, model_api(pruned_model).abstract_params) == jax.tree.map(jnp.shape, pruned_params)
    for path, heads in PRUNED[name].items():
        attention = pruned_params
        for part in path.split("/"):
            attention = attention[part]
        assert attention["query"]["kernel"].shape == (32, 4 - len(heads), 8)
        assert attention["out"]["kernel"].shape == (4 - len(heads), 8, 32)
    np.testing.assert_allclose(logits(pruned_model, pruned_params, name), want, rtol=1e-5, atol=1e-5)


def test_sharded_importance_equals_one_device():
    model = EncoderDecoder(T5)
    api, params = model_api(model), float_params(model)
    batch = {**inputs("t5", 3), "decoder_target_tokens": inputs("t5", 4)["decoder_input_tokens"],
             "decoder_loss_weights": np.ones((4, 5), np.int32)}
    results = []
    for mesh_config, devices in [(partitioning.MeshConfig(data=2, fsdp=2, tensor=2), None),
                                 (partitioning.MeshConfig(data=1), jax.devices()[:1])]:
        mesh = partitioning.make_mesh(mesh_config, devices)
        with jax.set_mesh(mesh):
            shardings = partitioning.logical_shardings(api.boxed_abstract_params, mesh, mesh_config.rules)
            sharded = jax.device_put(params, shardings)
            results.append(head_importance(model, sharded, [partitioning.global_batch(batch, mesh)]))
    (sharded, single) = results
    assert sorted(sharded) == sorted(single)
    for path in single:
        np.testing.assert_allclose(sharded[path], single[path], rtol=1e-5, atol=1e-8, err_msg=path)


def init(model):
    return model_api(model).boxed_abstract_params


@pytest.mark.parametrize("call, message", [
    (lambda: least_important({"a": np.ones(2)}, 1.0), "fraction=1.0 must be in [0, 1)"),
    (lambda: least_important({"a": np.ones(2)}, True), "fraction=True must be in [0, 1)"),
    (lambda: least_important({"a": np.ones(4), "b": np.ones(4)}, 0.9),
     "fraction=0.9 would prune 7 of 8 heads, but each of the 2 attentions keeps one: give a fraction of at most 0.75"),
    (lambda: head_pruned(MODELS["bert"], {"layers_0/attention": (-1,)}), "must be a non-empty tuple of head indices"),
    (lambda: init(head_pruned(MODELS["bert"], {"layers_0/attention": (0, 1, 2, 3)})),
     "prunes all 4 heads; keep at least one"),
    (lambda: init(head_pruned(MODELS["bert"], {"layers_1/attention": (4,)})), "has head 4, but that attention has 4"),
    (lambda: init(head_pruned(MODELS["bert"], {"layers_2/attention": (0,)})),
     "names 'layers_2/attention', which is no attention of HeadPrunedBert"),
    (lambda: init(head_masked(Bert(dataclasses.replace(BERT, scan_layers=True)))), "set its config's scan_layers"),
    (lambda: with_masks(head_masked(MODELS["bert"]), float_params(MODELS["bert"]), {"layers_0/attn": np.ones(4)}),
     "head mask for 'layers_0/attn': no attention has that path"),
    (lambda: with_masks(head_masked(MODELS["bert"]), float_params(MODELS["bert"]), {"layers_0/attention": np.ones(3)}),
     "has shape (3,); that attention has 4 heads"),
    (lambda: prune_params(float_params(MODELS["bert"]), {"layers_0/attention": (4,)}), "has head 4"),
    (lambda: iterative_pruning(MODELS["gpt2"], {}, [], 0.5, rounds=0), "rounds=0 must be an integer >= 1"),
    (lambda: iterative_pruning(MODELS["gpt2"], float_params(MODELS["gpt2"]), gpt2_batches(), 0.25, rounds=3),
     "rounds=3 with fraction=0.25, which prunes 2 heads: give at most 2 rounds"),
])
def test_bad_values_are_refused_in_one_line(call, message):
    with pytest.raises(ValueError) as error:
        call()
    assert message in str(error.value) and "\n" not in str(error.value)
