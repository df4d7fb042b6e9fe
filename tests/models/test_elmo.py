"""ELMo against a float64 NumPy reference written from the equations (character CNN, highway, LSTM cell), and
the directions' causality: the forward LM never reads later tokens, the backward LM never earlier ones."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.models.elmo import Elmo, ElmoConfig

CONFIG = ElmoConfig(vocab_size=23, max_characters=7, character_dim=5, filters=((1, 4), (2, 3), (3, 5)),
                    num_highway=2, hidden_dim=6, num_layers=2)
LENGTHS = (6, 4, 1)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def character_encoder(p, characters):
    """chars [b, s, c] -> [b, s, d]: embed, valid convolutions max-pooled, ReLU, highway layers, projection."""
    table = p["character_embedding"]["embedding"][characters]  # [b, s, c, e]
    pooled = []
    for width, _ in CONFIG.filters:
        kernel, bias = p[f"filter_{width}"]["kernel"], p[f"filter_{width}"]["bias"]  # [w, e, n], [n]
        windows = np.stack([np.einsum("bske,ken->bsn", table[:, :, t : t + width], kernel) + bias
                            for t in range(CONFIG.max_characters - width + 1)], axis=2)
        pooled.append(windows.max(axis=2))
    x = np.maximum(np.concatenate(pooled, -1), 0)
    f = x.shape[-1]
    for i in range(CONFIG.num_highway):
        h = x @ p[f"highway_{i}"]["kernel"] + p[f"highway_{i}"]["bias"]
        gate = sigmoid(h[..., f:])
        x = gate * x + (1 - gate) * np.maximum(h[..., :f], 0)
    return x @ p["projection"]["kernel"] + p["projection"]["bias"]


def lstm(p, x):
    """One LSTM layer over x [s, d] from zero state: i, f, o = sigmoid, g = tanh of W_i x + W_h h + b."""
    h, c, out = np.zeros(CONFIG.hidden_dim), np.zeros(CONFIG.hidden_dim), []
    for x_t in x:
        gate = {k: x_t @ p[f"i{k}"]["kernel"] + h @ p[f"h{k}"]["kernel"] + p[f"h{k}"]["bias"] for k in "ifgo"}
        c = sigmoid(gate["f"]) * c + sigmoid(gate["i"]) * np.tanh(gate["g"])
        h = sigmoid(gate["o"]) * np.tanh(c)
        out.append(h)
    return np.stack(out)


def direction(p, x):
    """The LSTM layers of one direction over a row's real tokens x [n, d], the second with a residual."""
    states = []
    for i in range(CONFIG.num_layers):
        h = lstm(p[f"layer_{i}"], x)
        x = h + x if i > 0 else h
        states.append(x)
    return states


def reference(params, tokens, characters):
    """float64: logits of both directions [b, s, V] (zero at padding) and the three layers [3, b, s, 2d]."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), nn.unbox(params))
    x = character_encoder(p["token_encoder"], characters)
    b, s = tokens.shape
    logits = np.zeros((2, b, s, CONFIG.vocab_size))
    layers = np.zeros((3, b, s, 2 * CONFIG.hidden_dim))
    for row in range(b):
        n = int((tokens[row] != 0).sum())
        forward = direction(p["forward_lm"], x[row, :n])
        backward = [h[::-1] for h in direction(p["backward_lm"], x[row, :n][::-1])]
        for k, states in enumerate((forward, backward)):
            logits[k, row, :n] = states[-1] @ p["softmax"]["kernel"] + p["softmax"]["bias"]
        layers[0, row, :n] = np.concatenate([x[row, :n], x[row, :n]], -1)
        for i in range(CONFIG.num_layers):
            layers[i + 1, row, :n] = np.concatenate([forward[i], backward[i]], -1)
    return logits, layers


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    tokens = np.zeros((len(LENGTHS), max(LENGTHS)), np.int32)
    characters = np.zeros((*tokens.shape, CONFIG.max_characters), np.int32)
    for row, n in enumerate(LENGTHS):
        tokens[row, :n] = rng.integers(3, CONFIG.vocab_size, n)
        characters[row, :n] = rng.integers(1, CONFIG.num_characters, (n, CONFIG.max_characters))
    return tokens, characters


@pytest.fixture(scope="module")
def model_and_params():
    model = Elmo(CONFIG)
    tokens, characters = inputs()
    params = model.init(jax.random.key(0), jnp.asarray(tokens), jnp.asarray(characters))["params"]
    # Non-zero biases, so that a transposed or dropped bias shows.
    params = jax.tree.map(lambda a: a + 0.1 * jax.random.normal(jax.random.key(a.size), a.shape), nn.unbox(params))
    return model, params


def test_logits_and_layers_equal_float64_numpy(model_and_params):
    model, params = model_and_params
    tokens, characters = inputs()
    out = model.apply({"params": params}, jnp.asarray(tokens), jnp.asarray(characters))
    layers = model.apply({"params": params}, jnp.asarray(tokens), jnp.asarray(characters),
                         method="layer_representations")
    want_logits, want_layers = reference(params, tokens, characters)
    valid = tokens != 0
    for k, got in enumerate((out.forward_logits, out.backward_logits)):
        np.testing.assert_allclose(np.asarray(got)[valid], want_logits[k][valid], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(layers)[:, valid], want_layers[:, valid], atol=1e-5, rtol=1e-5)


def test_forward_never_sees_later_tokens_and_backward_never_earlier(model_and_params):
    model, params = model_and_params
    tokens, characters = inputs()
    run = jax.jit(lambda t, c: model.apply({"params": params}, t, c))
    base = run(tokens, characters)
    n, k = LENGTHS[0], 2
    changed_chars = characters.copy()
    changed_chars[0, k] = (characters[0, k] + 5) % CONFIG.num_characters
    changed_tokens = tokens.copy()
    changed_tokens[0, k] = tokens[0, k] % (CONFIG.vocab_size - 3) + 3
    other = run(changed_tokens, changed_chars)
    moved = {name: np.abs(np.asarray(getattr(other, name) - getattr(base, name)))[0, :n].max(-1)
             for name in ("forward_logits", "backward_logits")}
    assert np.all(moved["forward_logits"][:k] == 0) and np.all(moved["forward_logits"][k:] > 1e-6)
    assert np.all(moved["backward_logits"][k + 1 :] == 0) and np.all(moved["backward_logits"][: k + 1] > 1e-6)
    for name in moved:  # the other rows are untouched
        np.testing.assert_array_equal(np.asarray(getattr(other, name))[1:], np.asarray(getattr(base, name))[1:])


def test_config_refuses_filters_wider_than_the_characters():
    with pytest.raises(ValueError, match="widths <= max_characters"):
        ElmoConfig(max_characters=3, filters=((4, 8),))
