"""ELMo's loss against a hand computation, its layers read by the probing tools and mixed by the scalar mix
(against NumPy), and (slow) the demo run: a few steps lower both perplexities and `ptmjax probe` mixes its three
layers."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cli_runs import train_from_cli

from ptmjax.adapt.probing.layer_features import LayerReader
from ptmjax.adapt.probing.mix_training import fit_mix_classifier, mix_probe
from ptmjax.adapt.probing.scalar_mix import ScalarMix
from ptmjax.data.word_vocabulary import WordVocabulary
from ptmjax.families.bidirectional_lm import bidirectional_lm_loss
from ptmjax.families.token_loss import LossConfig
from ptmjax.models.elmo import Elmo, ElmoConfig, ElmoOutput

VOCABULARY = WordVocabulary(size=40, max_characters=7)
CONFIG = ElmoConfig(vocab_size=40, max_characters=7, character_dim=4, filters=((1, 3), (2, 3)), hidden_dim=5)


def log_softmax(x):
    x = np.asarray(x, np.float64)
    return x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))


def test_loss_is_the_sum_of_both_directions_mean_nlls():
    rng = np.random.default_rng(0)
    logits = [rng.normal(size=(2, 5, 7)).astype(np.float32) for _ in range(2)]
    tokens = np.array([[3, 4, 5, 6, 0], [4, 5, 6, 3, 5]])
    lengths = (tokens != 0).sum(1)
    batch = {"forward_targets": np.roll(tokens, -1, 1), "backward_targets": np.roll(tokens, 1, 1)}
    batch["forward_weights"] = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    batch["backward_weights"] = np.array([[0, 1, 1, 1, 0], [0, 1, 1, 1, 1]])
    terms = bidirectional_lm_loss(ElmoOutput(*map(jnp.asarray, logits)), batch, LossConfig(z_loss=0.0))
    metrics = terms.stats.metrics()
    nll = {}
    for name, direction_logits in zip(("forward", "backward"), logits, strict=True):
        picked = np.take_along_axis(log_softmax(direction_logits), batch[f"{name}_targets"][..., None], -1)[..., 0]
        nll[name] = -(picked * batch[f"{name}_weights"]).sum() / (lengths - 1).sum()
        np.testing.assert_allclose(metrics[f"{name}_nll"], nll[name], rtol=1e-6)
        np.testing.assert_allclose(metrics[f"{name}_perplexity"], np.exp(nll[name]), rtol=1e-6)
    # The train step divides the token loss by the forward weights' sum: the sum of the two mean NLLs.
    np.testing.assert_allclose(terms.token_loss / batch["forward_weights"].sum(), nll["forward"] + nll["backward"],
                               rtol=1e-6)
    np.testing.assert_allclose(metrics["loss"], nll["forward"] + nll["backward"], rtol=1e-6)


@pytest.fixture(scope="module")
def reader_and_tokens():
    model = Elmo(CONFIG)
    tokens = np.array([[5, 9, 3, 1, 0, 0], [7, 2, 30, 11, 12, 1]], np.int32)
    chars = VOCABULARY.character_table[tokens]
    params = model.init(jax.random.key(0), jnp.asarray(tokens), jnp.asarray(chars))["params"]
    return LayerReader(model, params, VOCABULARY), model, params, tokens


def test_layer_reader_gives_elmos_three_layers(reader_and_tokens):
    reader, model, params, tokens = reader_and_tokens
    outputs = reader(tokens)
    want = model.apply({"params": params}, jnp.asarray(tokens), jnp.asarray(VOCABULARY.character_table[tokens]),
                       method="layer_representations")
    assert outputs.hidden.shape == (3, 2, 6, 2 * CONFIG.hidden_dim) and reader.num_layers == 2
    np.testing.assert_allclose(outputs.hidden, np.asarray(want), rtol=1e-5, atol=1e-7)  # jitted vs not
    assert not reader.has_attention and outputs.attention.shape == (0, 2, 0, 6, 6)
    with pytest.raises(ValueError, match="word vocabulary"):
        LayerReader(model, params)


def test_scalar_mix_of_elmos_layers_equals_hand_computation(reader_and_tokens):
    reader, _, _, tokens = reader_and_tokens
    layers = reader(tokens).hidden
    weights, gamma = np.array([0.3, -1.2, 0.8]), 1.7
    mixed = ScalarMix(3).apply({"params": {"weights": jnp.asarray(weights), "gamma": jnp.asarray(gamma)}},
                               jnp.asarray(layers))
    s = np.exp(weights) / np.exp(weights).sum()
    want = gamma * (s[0] * layers[0].astype(np.float64) + s[1] * layers[1] + s[2] * layers[2])
    np.testing.assert_allclose(np.asarray(mixed), want, rtol=1e-5, atol=1e-6)


def test_mix_probe_reports_the_fitted_mix(reader_and_tokens):
    rng = np.random.default_rng(0)
    features = rng.normal(size=(3, 40, 6)).astype(np.float32)
    labels = (features[2, :, 0] > 0).astype(int)  # only the last layer tells the label
    probe = mix_probe(features[:, :30], labels[:30], features[:, 30:], labels[30:], steps=100)
    params, _ = fit_mix_classifier(features[:, :30, None], np.ones((30, 1), bool), labels[:30], 2, 100)
    fitted = np.asarray(params["scalar_mix"]["weights"], np.float64)
    np.testing.assert_allclose(probe.weights, np.exp(fitted) / np.exp(fitted).sum(), rtol=1e-5)
    assert abs(sum(probe.weights) - 1) < 1e-6 and probe.gamma == pytest.approx(float(params["scalar_mix"]["gamma"]))
    assert np.argmax(probe.weights) == 2 and probe.train_accuracy > 90


@pytest.mark.slow
def test_demo_lowers_both_perplexities_and_probe_mixes_its_layers(tmp_path):
    from ptmjax import cli

    run = tmp_path / "elmo"
    records = train_from_cli("runs/elmo_demo.gin", run, 30, "train.task_feature_lengths = {'targets': 32}",
                             "train.batch_size = 16")
    train = [r for r in records if "forward_perplexity" in r]
    for name in ("forward_perplexity", "backward_perplexity"):
        assert train[-1][name] < 0.5 * train[0][name], (name, train[0][name], train[-1][name])
    assert cli.main(["probe", f"--model_dir={run}", "--max_length=32"]) == 0
    with open(run / "probe" / "scalar_mix.json") as f:
        mix = json.load(f)
    assert len(mix["weights"]) == 3 and abs(sum(mix["weights"]) - 1) < 1e-6 and mix["accuracy"] > 0
