"""XLM's language embedding (`EncoderConfig.num_languages`): the encoder with it equals the encoder without it
whose token-type table holds the language vectors added by hand, its embeddings equal a float64 NumPy
LayerNorm of the summed rows, explicit positions restart as XLM's do, the family reads translation-LM batches
(language ids hand-checked on a real TLM row), and two SGD steps sharded equal one device."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import seqio
from data.gettext_files import machine_locales_or_skip
from flax import linen as nn

from ptmjax import partitioning
from ptmjax.data import message_pairs, pipeline
from ptmjax.families.model_api import model_api
from ptmjax.families.registry import TRANSLATION_LM, family_of
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import Bert, BertConfig
from ptmjax.models.encoder import Embeddings
from ptmjax.partitioning import MeshConfig
from ptmjax.tasks import multilingual
from ptmjax.training.trainer import Trainer

LANGUAGES, BATCH, LENGTH = 3, 8, 16
TINY = dict(vocab_size=304, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=LENGTH, nsp_head=False,
            dropout_rate=0.0, attention_dropout_rate=0.0)
XLM = Bert(BertConfig(**TINY, num_languages=LANGUAGES))


def rows(seed: int = 0) -> dict[str, np.ndarray]:
    """TLM-like rows: [a </s> b </s>] then padding, positions restarting at b, language 0 on a and 1 or 2 on b."""
    rng = np.random.default_rng(seed)
    tokens, positions, languages = (np.zeros((BATCH, LENGTH), np.int32) for _ in range(3))
    for i in range(BATCH):
        a, b = rng.integers(2, 7, 2)
        tokens[i, : a + b] = rng.integers(3, TINY["vocab_size"], a + b)
        tokens[i, [a - 1, a + b - 1]] = 1
        positions[i, : a + b] = [*range(a), *range(b)]
        languages[i, a: a + b] = rng.integers(1, LANGUAGES)
    selected = (rng.random((BATCH, LENGTH)) < 0.3) & (tokens > 1)
    return {"input_tokens": np.where(selected, 300, tokens).astype(np.int32), "target_tokens": tokens,
            "loss_mask": selected.astype(np.int32), "positions": positions, "language_ids": languages}


def test_language_vectors_equal_the_plain_model_with_them_added_by_hand_to_its_type_table():
    batch = rows()
    params = nn.meta.unbox(XLM.init(jax.random.key(0), batch["input_tokens"])["params"])
    params = jax.tree.map(lambda x: x + 0.5 * jax.random.normal(jax.random.key(1), x.shape), params)  # not at init
    embeddings = params["embeddings"]
    plain = Bert(BertConfig(**{**TINY, "type_vocab_size": LANGUAGES}))
    by_hand = np.asarray(embeddings["token_type_embedder"]["embedding"])[0] + np.asarray(
        embeddings["language_embedder"]["embedding"])  # [languages, d]: type 0 + each language's vector
    plain_params = {**params, "embeddings": {
        **{k: v for k, v in embeddings.items() if k != "language_embedder"},
        "token_type_embedder": {"embedding": jnp.asarray(by_hand)}}}
    inputs = {k: batch[k] for k in ("input_tokens", "positions")}
    got = XLM.apply({"params": params}, **inputs, language_ids=batch["language_ids"])
    want = plain.apply({"params": plain_params}, **inputs, token_type_ids=batch["language_ids"])
    np.testing.assert_allclose(got.mlm_logits, want.mlm_logits, atol=2e-5)
    without = XLM.apply({"params": params}, **inputs, language_ids=np.zeros_like(batch["language_ids"]))
    assert np.abs(np.asarray(without.mlm_logits) - np.asarray(got.mlm_logits)).max() > 1e-2  # the ids matter


def test_embeddings_equal_a_float64_layer_norm_of_the_summed_rows():
    batch = rows(1)
    module = Embeddings(XLM.config)
    args = (batch["input_tokens"], None, False, batch["positions"], batch["language_ids"])
    variables = nn.meta.unbox(module.init(jax.random.key(2), *args))
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), variables["params"])
    summed = (p["token_embedder"]["embedding"][batch["input_tokens"]] + p["token_type_embedder"]["embedding"][0]
              + p["position_embedder"]["embedding"][batch["positions"]]
              + p["language_embedder"]["embedding"][batch["language_ids"]])
    centred = summed - summed.mean(-1, keepdims=True)
    want = centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + XLM.config.layer_norm_epsilon)
    want = want * p["layer_norm"]["scale"] + p["layer_norm"]["bias"]
    np.testing.assert_allclose(module.apply(variables, *args), want, atol=1e-5)


def test_roberta_positions_count_from_after_the_padding_id():
    config = BertConfig(**{**TINY, "max_length": LENGTH + 2}, pad_token_id=1, positions_after_padding=True)
    tokens = np.array([[0, 5, 6, 2, 1, 1]], np.int32)
    model = Bert(config)
    params = model.init(jax.random.key(0), tokens)["params"]
    default = model.apply({"params": params}, tokens)
    explicit = model.apply({"params": params}, tokens, positions=np.array([[0, 1, 2, 3, 0, 0]], np.int32))
    np.testing.assert_allclose(explicit.mlm_logits, default.mlm_logits, atol=1e-6)


def test_the_config_refuses_a_sentence_pair_head_and_the_plain_model_language_ids():
    with pytest.raises(ValueError, match="num_languages=3 trains on translation-LM rows.*nsp_head"):
        BertConfig(**{**TINY, "nsp_head": True}, num_languages=3)
    plain = Bert(BertConfig(**TINY))
    tokens = rows()["input_tokens"]
    with pytest.raises(ValueError, match="num_languages=0 has no language embedding"):
        plain.init(jax.random.key(0), tokens, language_ids=np.zeros_like(tokens))


@pytest.mark.slow  # reads the catalogs of de and fr: 30-50 s on two shared cores
def test_the_family_feeds_tlm_batches_with_each_halfs_language():
    locales = machine_locales_or_skip("de", "fr")
    if locales != ("de", "fr"):
        pytest.skip(f"this machine has catalogs for {locales} of ('de', 'fr') only")
    vocabulary = seqio.ByteVocabulary()
    multilingual.register_multilingual_tasks(locales, vocabulary=vocabulary)
    assert family_of(XLM) is TRANSLATION_LM
    length = 256
    batch = next(pipeline.get_dataset(
        multilingual.tlm_task_name("fr"), "validation", {"inputs": length, "targets": length}, 2, seed=0,
        shuffle=False, pack=False, feature_converter=family_of(XLM).feature_converter).as_numpy_iterator())
    english, french = message_pairs.sentence_pairs("fr", "validation")[0]
    source, target = len(vocabulary.encode(english)) + 1, len(vocabulary.encode(french)) + 1  # each with its </s>
    want = [0] * source + [2] * target + [0] * (length - source - target)  # en 0, de 1, fr 2; padding 0
    assert batch["language_ids"][0].tolist() == want
    assert batch["positions"][0, : source + target].tolist() == [*range(source), *range(target)]
    model = Bert(BertConfig(**{**TINY, "vocab_size": vocabulary.vocab_size, "max_length": length},
                            num_languages=LANGUAGES))
    params = model.init(jax.random.key(0), batch["input_tokens"])["params"]
    assert set(model_api(model).model_inputs(batch)) == {"input_tokens", "positions", "language_ids"}
    logits = model.apply({"params": params}, batch["input_tokens"], positions=batch["positions"],
                         language_ids=batch["language_ids"]).mlm_logits
    assert logits.shape == (2, length, vocabulary.vocab_size) and np.isfinite(logits).all()


@functools.lru_cache(maxsize=None)
def train(mesh_config: MeshConfig, single_device: bool = False):
    mesh = partitioning.make_mesh(mesh_config, jax.devices()[:1] if single_device else None)
    trainer = Trainer(XLM, optax.sgd(0.05), lambda _: 0.05, mesh, mesh_config.rules, LossConfig(z_loss=0.0))
    state = trainer.init_state(jax.random.key(0))
    batch = partitioning.global_batch(rows(), mesh)
    losses = []
    for _ in range(2):
        state, metrics = trainer.train_step(state, batch, jax.random.key(1))
        losses.append(float(metrics["loss"]))
    return jax.device_get(state.params), np.array(losses)


@pytest.mark.slow  # compiles two trainers: about 40 s on two shared cores
def test_xlm_trains_sharded_as_on_one_device():
    want_params, want_losses = train(MeshConfig(), single_device=True)
    got_params, got_losses = train(MeshConfig(data=2, fsdp=2, tensor=2))
    assert want_losses[1] < want_losses[0]
    np.testing.assert_allclose(got_losses, want_losses, rtol=2e-5)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5), got_params, want_params)
    language_table = want_params["embeddings"]["language_embedder"]["embedding"]
    assert language_table.shape == (LANGUAGES, TINY["d_model"])


def test_the_hugging_face_export_refuses_the_language_table():
    from ptmjax.convert import hf_bert

    with pytest.raises(ValueError, match=r"num_languages=3 has no Hugging Face encoder equivalent; use num_languages"):
        hf_bert.to_hf_config(XLM.config)
