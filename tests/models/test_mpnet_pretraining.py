"""MPNet's two-stream pre-training model against a float64 NumPy reference written from the paper's masks, and
against transformers' MPNetForMaskedLM on the text the content stream stands for."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_gin_config, numpy_boxed_variables, perturbed_hf_model
from scipy.special import erf

from ptmjax.models.mpnet import MPNet, MPNetConfig, MPNetPretraining

CONFIG = MPNetConfig(
    vocab_size=101, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=40, pad_token_id=1,
    positions_after_padding=True, dropout_rate=0.0, attention_dropout_rate=0.0, layer_norm_epsilon=1e-5,
)
MASK_ID = 100
ROWS = ((20, 3), (9, 2), (26, 4))  # (n, b): the text's length and how many of it are predicted


def mpnet_rows(seed: int = 0, rows=ROWS, pad_id_in_text: bool = False):
    """The objective's layout for random texts: (input_tokens [r, N], positions [r, N], loss_mask [r, Q],
    texts, orders), padded with 0 as seqio pads; a mask slot holds the mask id, a random id or its token.
    pad_id_in_text: the first text holds id 1 (seqio's EOS, MPNet's padding id): content all the same."""
    rng = np.random.default_rng(seed)
    width, queries = max(n + b for n, b in rows), max(b for _, b in rows)
    tokens, positions = np.zeros((len(rows), width), np.int32), np.zeros((len(rows), width), np.int32)
    loss_mask, texts, orders = np.zeros((len(rows), queries), np.int32), [], []
    for r, (n, b) in enumerate(rows):
        text, order = rng.integers(3, MASK_ID, n), rng.permutation(n)
        text[:1] = 1 if pad_id_in_text and r == 0 else text[:1]
        masks = np.where(rng.random(b) < 0.8, MASK_ID, rng.integers(3, MASK_ID, b))
        tokens[r, :n + b] = np.concatenate([text[order], masks])
        positions[r, :n + b] = np.concatenate([order, order[n - b:]])
        loss_mask[r, :b] = 1
        texts.append(text)
        orders.append(order)
    return tokens, positions, loss_mask, texts, orders


def visibility(n: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The paper's masks over content slots [x in order (n), masks (b)], case by case (True: may attend)."""
    c, slots = n - b, n + b
    real_step = np.arange(slots) < n  # slot j < n holds the real token of step j; slot n + i the mask of step c + i
    step = np.where(real_step, np.arange(slots), np.arange(slots) - b)
    content = np.zeros((slots, slots), bool)
    for row in range(slots):
        if real_step[row] and step[row] >= c:  # a predicted token: the order up to itself, the later masks
            content[row] = np.where(real_step, step <= step[row], step > step[row])
        else:  # an unpredicted token or a mask: the unpredicted tokens and every mask
            content[row] = np.where(real_step, step < c, True)
    query = np.stack([np.where(real_step, step < t, step >= t) for t in range(c, n)])
    return content, query


def numpy_buckets(relative: np.ndarray) -> np.ndarray:
    """Hugging Face MPNet's relative_position_bucket (32 buckets, distance 128), in float32 as torch computes it."""
    n = -relative
    bucket = (n < 0) * 16
    n = np.abs(n)
    far = np.maximum(n, 8).astype(np.float32)  # the exact buckets below 8 take no logarithm
    large = 8 + (np.log(far / np.float32(8)) / np.float32(np.log(16)) * 8).astype(np.int64)
    return bucket + np.where(n < 8, n, np.minimum(large, 15))


def numpy_two_streams(params, config: MPNetConfig, tokens, positions, rows=ROWS):
    """float64 (content [r][slots, e], query logits [r][b, vocab]) of each row, written from the paper."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)

    def norm(x, ln):
        x = x - x.mean(-1, keepdims=True)
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + config.layer_norm_epsilon) * ln["scale"] + ln["bias"]

    def gelu(x):
        return 0.5 * x * (1 + erf(x / np.sqrt(2)))

    def attend(a, x, keys, visible, query_pos, key_pos):
        q, k, v = (np.einsum("se,ehd->hsd", y, a[name]["kernel"]) + a[name]["bias"][:, None]
                   for name, y in (("query", x), ("key", keys), ("value", keys)))
        table = p["relative_position_bias"]["rel_embedding"]
        bias = table[numpy_buckets(key_pos[None, :] - query_pos[:, None])].transpose(2, 0, 1)
        logits = np.where(visible, q @ k.transpose(0, 2, 1) / np.sqrt(config.head_dim) + bias, -np.inf)
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        return np.einsum("hsd,hde->se", weights @ v, a["out"]["kernel"]) + a["out"]["bias"]

    contents, logits = [], []
    for r, (n, b) in enumerate(rows):
        content_visible, query_visible = visibility(n, b)
        tok, pos = tokens[r, :n + b], positions[r, :n + b]
        emb = p["embeddings"]
        content = norm(emb["token_embedder"]["embedding"][tok] + emb["position_embedder"]["embedding"][pos + 2],
                       emb["layer_norm"])
        query, query_pos = content[n:], pos[n:]  # the queries start as their mask tokens
        for i in range(config.num_layers):
            layer = p[f"layers_{i}"]

            def update(x, visible, x_pos, keys=content, key_pos=pos, layer=layer):
                attended = attend(layer["attention"], x, keys, visible, x_pos, key_pos)
                x = norm(x + attended, layer["attention_layer_norm"])
                hidden = gelu(x @ layer["mlp"]["wi"]["kernel"] + layer["mlp"]["wi"]["bias"])
                return norm(x + hidden @ layer["mlp"]["wo"]["kernel"] + layer["mlp"]["wo"]["bias"],
                            layer["mlp_layer_norm"])

            content, query = update(content, content_visible, pos), update(query, query_visible, query_pos)
        head = p["mlm_head"]
        h = norm(gelu(query @ head["transform"]["kernel"] + head["transform"]["bias"]), head["layer_norm"])
        contents.append(content)
        logits.append(h @ p["embeddings"]["token_embedder"]["embedding"].T + head["bias"])
    return contents, logits


def test_two_streams_equal_a_float64_numpy_reference():
    tokens, positions, loss_mask, _, _ = mpnet_rows(pad_id_in_text=True)
    model = MPNetPretraining(CONFIG)
    variables = nn.meta.unbox(numpy_boxed_variables(lambda: model.init(jax.random.key(0), tokens, positions,
                                                                       loss_mask)))
    logits = jax.jit(model.apply)(variables, tokens, positions, loss_mask)
    content, _ = jax.jit(lambda v: model.apply(v, tokens, positions, loss_mask, method=model.two_streams))(variables)
    want_content, want_logits = numpy_two_streams(variables["params"], CONFIG, tokens, positions)
    assert logits.shape == (3, 4, CONFIG.vocab_size) and logits.dtype == jnp.float32
    errors = []
    for r, (n, b) in enumerate(ROWS):
        scale = np.abs(want_logits[r]).max()
        errors.append(np.abs(np.asarray(logits[r, :b]) - want_logits[r]).max() / scale)
        np.testing.assert_allclose(np.asarray(content[r, :n + b]), want_content[r], atol=2e-5)
    print("relative logit errors", [f"{e:.1e}" for e in errors])
    assert max(errors) < 1e-5


def test_content_stream_and_first_query_equal_transformers_on_the_masked_text():
    """MPNet's content stream is MLM on [unpredicted tokens, masks] in a permuted layout: its unpredicted and mask
    slots, and the first query (which sees just those), equal MPNetForMaskedLM on the text with the predicted
    tokens masked, at their positions; a padded row too."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from ptmjax.convert import hf_mpnet

    hf_model = perturbed_hf_model(lambda: hf_mpnet.build_hf_model(CONFIG))
    params = hf_mpnet.hf_to_params(hf_model.state_dict(), CONFIG)
    tokens, positions, loss_mask, texts, orders = mpnet_rows(seed=1)
    width = max(n for n, _ in ROWS)
    masked = np.full((len(ROWS), width), CONFIG.pad_token_id)
    for r, (n, b) in enumerate(ROWS):
        masked[r, :n] = texts[r]
        masked[r, orders[r][n - b:]] = tokens[r, n:n + b]
    with torch.no_grad():
        hf_out = hf_model(torch.tensor(masked), attention_mask=torch.tensor((masked != 1).astype(np.int64)),
                          output_hidden_states=True)
    hf_hidden, hf_logits = hf_out.hidden_states[-1].numpy(), hf_out.logits.numpy()
    model = MPNetPretraining(CONFIG)
    content, _ = model.apply(params, tokens, positions, loss_mask, method=model.two_streams)
    logits = model.apply(params, tokens, positions, loss_mask)
    for r, (n, b) in enumerate(ROWS):
        slots = np.r_[: n - b, n: n + b]  # the unpredicted tokens and the masks
        np.testing.assert_allclose(np.asarray(content[r, slots]), hf_hidden[r, positions[r, slots]], atol=1e-5)
        np.testing.assert_allclose(np.asarray(logits[r, 0]), hf_logits[r, orders[r][n - b]], atol=1e-5)


def test_the_pretraining_model_has_mpnets_parameters_and_refuses_what_its_layers_lack():
    import dataclasses

    tokens, positions, loss_mask, _, _ = mpnet_rows()
    two_stream = jax.eval_shape(MPNetPretraining(CONFIG).init, jax.random.key(0), tokens, positions, loss_mask)
    encoder = jax.eval_shape(MPNet(CONFIG).init, jax.random.key(0), tokens)
    assert jax.tree.structure(two_stream) == jax.tree.structure(encoder)
    for change in ({"scan_layers": True}, {"num_layer_groups": 1}):
        model = MPNetPretraining(dataclasses.replace(CONFIG, **change))
        with pytest.raises(ValueError, match=f"does not support MPNetConfig {{'{next(iter(change))}'"):
            jax.eval_shape(model.init, jax.random.key(0), tokens, positions, loss_mask)


@pytest.mark.slow
def test_on_the_tasks_rows_each_query_reads_its_own_mask_and_never_its_token():
    """End to end on `ptmjax_stdlib_masked_permuted_lm` through its feature converter (tiny gin config, pad id 1):
    query k's logits change with its mask slot's token and never with the token it predicts."""
    from ptmjax.data import pipeline
    from ptmjax.families.registry import family_of

    model = MPNetPretraining(load_gin_config("mpnet_tiny", MPNetConfig))
    batch = next(pipeline.get_dataset(
        "ptmjax_stdlib_masked_permuted_lm", "validation", {"inputs": 64, "targets": 9}, 2, seed=0, shuffle=False,
        pack=False, feature_converter=family_of(model).feature_converter,
    ).as_numpy_iterator())
    tokens, positions, loss_mask = batch["input_tokens"], batch["positions"], batch["loss_mask"]
    variables = model.init(jax.random.key(0), tokens, positions, loss_mask)
    logits = jax.jit(model.apply)
    base = np.asarray(logits(variables, tokens, positions, loss_mask))
    for row in range(len(tokens)):
        b, filled = int(loss_mask[row].sum()), int((tokens[row] != 0).sum())
        n = filled - b
        assert (batch["target_tokens"][row, :b] == tokens[row, n - b:n]).all()
        for k in (0, b - 1):
            for slot, moves in ((n - b + k, False), (n + k, True)):
                changed = tokens.copy()
                changed[row, slot] = 3 + (changed[row, slot] - 2) % 2000
                diff = np.abs(np.asarray(logits(variables, changed, positions, loss_mask)) - base)[row, k].max()
                assert (diff > 1e-4) if moves else (diff == 0.0), (row, k, slot, diff)
