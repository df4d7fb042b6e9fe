"""The cross-lingual measures of the multilingual experiment: sentence embeddings, retrieval of held-out message
pairs, and a classifier fine-tuned on English and scored on the translations (zero-shot transfer).

Sentence embedding: the mean of an encoder's final hidden states over a text's tokens, each token read with its
text's language id (XLM's language embedding, `EncoderConfig.num_languages`).

The classification label is the package a message comes from (`DOMAINS`): read from the catalogs of the English
message, so the translation of a message has its English side's label. A message found in two packages (any
package, in any of the locales read) has no label.
"""

from __future__ import annotations

import collections
import functools
import hashlib
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import seqio

from ptmjax.data import gettext_catalogs, message_pairs
from ptmjax.models.bert import Bert

DOMAINS = {"git": "version control", "postgres-15": "database server", "gtk20-properties": "GUI toolkit",
           "gnupg2": "cryptography"}  # gettext domain -> its class; the four largest of distinct kinds here
EMBED_BATCH = 64


def by_hash(texts: Sequence[str]) -> list[str]:
    """`texts` in the order of their SHA-256: a fixed sample that does not depend on reading order."""
    return sorted(texts, key=lambda text: hashlib.sha256(text.encode("utf-8")).digest())


def held_out_pairs(locale: str, count: int) -> list[tuple[str, str]]:
    """Up to `count` test-split (English, translation) pairs of `locale` whose English and translation are each
    unique among its test pairs, the `count` of smallest hash."""
    pairs = message_pairs.sentence_pairs(locale, "test")
    english = collections.Counter(e for e, _ in pairs)
    translated = collections.Counter(t for _, t in pairs)
    unique = {e: t for e, t in pairs if english[e] == 1 and translated[t] == 1}
    return [(e, unique[e]) for e in by_hash(list(unique))[:count]]


@functools.cache
def english_domains(locales: tuple[str, ...]) -> dict[str, frozenset[str]]:
    """{cleaned sentence-like English message: the gettext domains it comes from in any of `locales`}."""
    domains = collections.defaultdict(set)
    for locale in locales:
        for path in gettext_catalogs.catalog_paths()[locale]:
            domain = gettext_catalogs.domain_of(path)
            for message in gettext_catalogs.read_catalog(path).messages:
                if not (message.msgid and message.msgstr[0]):
                    continue
                pair = message_pairs.clean_pair(message.msgid, message.msgstr[0])
                if pair and message_pairs.is_sentence_like(*pair, domain):
                    domains[pair[0]].add(domain)
    return {english: frozenset(found) for english, found in domains.items()}


def label_of(english: str, locales: tuple[str, ...]) -> int | None:
    """The index in DOMAINS of the one package `english` comes from; None if another or several."""
    found = english_domains(locales).get(english, frozenset())
    return list(DOMAINS).index(next(iter(found))) if len(found) == 1 and found <= set(DOMAINS) else None


def classification_train(locales: tuple[str, ...], per_class: int) -> tuple[list[str], list[int]]:
    """English train-split messages, `per_class` of each label (smallest hash)."""
    english = {e for locale in locales for e, _ in message_pairs.sentence_pairs(locale, "train")}
    by_label = collections.defaultdict(list)
    for text in by_hash(list(english)):
        label = label_of(text, locales)
        if label is not None and len(by_label[label]) < per_class:
            by_label[label].append(text)
    return [t for label in sorted(by_label) for t in by_label[label]], [
        label for label in sorted(by_label) for _ in by_label[label]]


def classification_test(language: str, locales: tuple[str, ...]) -> tuple[list[str], list[int]]:
    """The labelled test-split messages of `language` ('en': the English sides of all `locales`), each text once."""
    labelled = {}
    for locale in locales if language == message_pairs.ENGLISH else (language,):
        for english, translation in message_pairs.sentence_pairs(locale, "test"):
            label = label_of(english, locales)
            text = english if language == message_pairs.ENGLISH else translation
            if label is not None:
                labelled.setdefault(text, label)
    texts = by_hash(list(labelled))
    return texts, [labelled[t] for t in texts]


def token_rows(vocabulary: seqio.Vocabulary, texts: Sequence[str], length: int) -> np.ndarray:
    """int32 [n, length]: each text's ids, cut to `length`, padded with 0."""
    rows = np.zeros((len(texts), length), np.int32)
    for i, text in enumerate(texts):
        ids = vocabulary.encode(text)[:length]
        rows[i, : len(ids)] = ids
    return rows


def mean_pooled(model: Bert, params, tokens: jax.Array, language_id: int) -> jax.Array:
    """[b, d_model]: the mean of the final hidden states over each row's real tokens."""
    languages = jnp.full_like(tokens, language_id) if model.config.num_languages else None
    hidden = model.apply({"params": params}, tokens, language_ids=languages, method=Bert.encode)
    real = (tokens != model.config.pad_token_id)[..., None].astype(hidden.dtype)
    return jnp.sum(hidden * real, axis=1) / jnp.maximum(jnp.sum(real, axis=1), 1.0)


def embeddings(model: Bert, params, rows: np.ndarray, language_id: int) -> np.ndarray:
    """Mean-pooled embeddings of token rows, EMBED_BATCH rows at a time."""
    embed = jax.jit(functools.partial(mean_pooled, model), static_argnums=2)
    return np.concatenate([np.asarray(embed(params, rows[i:i + EMBED_BATCH], language_id))
                           for i in range(0, len(rows), EMBED_BATCH)])


def retrieval_accuracy(source: np.ndarray, target: np.ndarray) -> float:
    """Accuracy at 1 of cosine nearest-neighbour retrieval: row i of `source` should find row i of `target`."""
    unit = [x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12) for x in (source, target)]
    return float(np.mean(np.argmax(unit[0] @ unit[1].T, axis=1) == np.arange(len(source))))


def classifier_logits(model: Bert, params, tokens: jax.Array, language_id: int) -> jax.Array:
    """[b, classes]: a linear head on the mean-pooled encoder."""
    pooled = mean_pooled(model, params["encoder"], tokens, language_id)
    return pooled @ params["head"]["kernel"] + params["head"]["bias"]


def fine_tune(model: Bert, encoder_params, rows: np.ndarray, labels: np.ndarray, *, steps: int, batch_size: int,
              learning_rate: float, seed: int):
    """The encoder and a new linear head trained on English rows (language 0) with AdamW; returns the parameters."""
    rng = np.random.default_rng(seed)
    head = {"kernel": jnp.asarray(rng.normal(0, 0.02, (model.config.d_model, len(DOMAINS))), jnp.float32),
            "bias": jnp.zeros((len(DOMAINS),), jnp.float32)}
    params = {"encoder": encoder_params, "head": head}
    tx = optax.adamw(optax.warmup_constant_schedule(0.0, learning_rate, steps // 10), weight_decay=0.01)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, tokens, targets):
        def loss(params):
            logits = classifier_logits(model, params, tokens, 0)
            return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

        grads = jax.grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    for _ in range(steps):
        index = rng.choice(len(rows), batch_size, replace=False)
        params, opt_state = step(params, opt_state, rows[index], labels[index])
    return params


def accuracy(model: Bert, params, rows: np.ndarray, labels: np.ndarray, language_id: int) -> float:
    """The fine-tuned classifier's accuracy on rows of one language."""
    logits = jax.jit(functools.partial(classifier_logits, model), static_argnums=2)
    predicted = np.concatenate([np.argmax(logits(params, rows[i:i + EMBED_BATCH], language_id), axis=-1)
                                for i in range(0, len(rows), EMBED_BATCH)])
    return float(np.mean(predicted == labels))


def majority_rate(labels: Sequence[int]) -> float:
    """The accuracy of always answering the most frequent label."""
    return max(collections.Counter(labels).values()) / len(labels)


def language_ids(locales: Sequence[str]) -> Mapping[str, int]:
    """en 0, then the locales 1, 2, ... (as `register_multilingual_tasks` numbers them)."""
    return {message_pairs.ENGLISH: 0, **{locale: i + 1 for i, locale in enumerate(locales)}}
