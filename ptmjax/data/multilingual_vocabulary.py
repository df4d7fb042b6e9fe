"""A multilingual SentencePiece vocabulary trained on the gettext sentence pairs (`message_pairs`).

Training text: the 'train' split of each locale's sentence-like pairs, as one text per language: the
translations of each locale, and English (the English sides of all of them, each sentence once). As XLM
and mT5 do, small languages are sampled up: language l with n_l sentences gets
min(n_l, round(max_sentences * p_l)) of them, p_l from `temperature_sampling.temperature_sampling_rates`
(T = 2 by default: XLM's alpha = 0.5). A language's sample is its sentences of smallest SHA-256, a
uniform subset that does not depend on the order the catalogs were read in.

The unigram model keeps T5's ids (pad 0, eos 1, unk 2) and covers 99.995% of the characters
(`character_coverage`; the rarest characters become unk). It is trained on first use and
cached at `$PTMJAX_CACHE_DIR/spm/gettext_unigram_{pieces}_{digest}.model`, the digest covering the
settings and the catalogs' bytes (`model_path`: finding the model hashes the files, about a second for all
of them, where building the training text parses and cleans them, about a minute). `unknown_rate`
measures what share of a text's pieces are unk.
"""

from __future__ import annotations

import functools
import hashlib
import pathlib
from collections.abc import Iterable, Sequence

import gin
import seqio

from ptmjax.data import gettext_catalogs, message_pairs, temperature_sampling, vocabularies

DEFAULT_PIECES = 16000
DEFAULT_TEMPERATURE = 2.0
DEFAULT_MAX_SENTENCES = 200_000
CHARACTER_COVERAGE = 0.99995
_TRAINER_VERSION = "v1"  # bump when the trainer arguments change


def _by_hash(texts: Iterable[str]) -> list[str]:
    return sorted(texts, key=lambda text: hashlib.sha256(text.encode("utf-8")).digest())


def language_texts(locales: Sequence[str], split: str = "train",
                   roots: tuple[str, ...] | None = None) -> dict[str, tuple[str, ...]]:
    """{'en': the English sides, locale: its translations} of the sentence-like pairs of `split`, each text
    once, in corpus order."""
    texts = {message_pairs.ENGLISH: {}}
    for locale in locales:
        pairs = message_pairs.sentence_pairs(locale, split, roots)
        texts[message_pairs.ENGLISH].update(dict.fromkeys(english for english, _ in pairs))
        texts[locale] = dict.fromkeys(translation for _, translation in pairs)
    return {language: tuple(language_texts) for language, language_texts in texts.items()}


@functools.cache
def training_sentences(locales: tuple[str, ...], temperature: float = DEFAULT_TEMPERATURE,
                       max_sentences: int = DEFAULT_MAX_SENTENCES,
                       roots: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The temperature-sampled training text of the module doc, language by language."""
    texts = language_texts(locales, "train", roots)
    rates = temperature_sampling.temperature_sampling_rates(
        {language: len(sentences) for language, sentences in texts.items()}, temperature)
    sample = []
    for language, sentences in texts.items():
        sample += _by_hash(sentences)[: min(len(sentences), round(max_sentences * rates[language]))]
    return tuple(sample)


def model_path(pieces: int, locales: Sequence[str], temperature: float, max_sentences: int,
               roots: tuple[str, ...] | None = None) -> pathlib.Path:
    """Where the model of these settings is (or will be) cached: the digest covers the settings and the bytes
    of every catalog of `locales`, so finding a trained model reads the files but parses none."""
    settings = (_TRAINER_VERSION, pieces, CHARACTER_COVERAGE, temperature, max_sentences, tuple(locales))
    digest = hashlib.sha256(repr(settings).encode())
    for locale in locales:
        for path in gettext_catalogs.catalog_paths(roots).get(locale, ()):
            digest.update(f"{locale}/{gettext_catalogs.domain_of(path)}\0".encode())
            digest.update(hashlib.sha256(pathlib.Path(path).read_bytes()).digest())
    return vocabularies.cache_dir() / "spm" / f"gettext_unigram_{pieces}_{digest.hexdigest()[:16]}.model"


class LazyMultilingualVocabulary(vocabularies.LazySentencePieceVocabulary):
    """The gettext vocabulary: trained on first use, equal to another of the same settings."""

    def __init__(self, vocab_size: int = DEFAULT_PIECES, extra_ids: int = vocabularies.DEFAULT_EXTRA_IDS,
                 locales: Sequence[str] | None = None, temperature: float = DEFAULT_TEMPERATURE,
                 max_sentences: int = DEFAULT_MAX_SENTENCES, roots: tuple[str, ...] | None = None):
        vocabularies.check_vocab_size(vocab_size)
        super().__init__(vocab_size, extra_ids)
        self._locales = None if locales is None else tuple(locales)
        self._sampling = (temperature, max_sentences)
        self._roots = roots

    def _trained_model(self) -> pathlib.Path:
        locales = self._locales or message_pairs.require_catalogs(self._roots)
        return vocabularies.train_cached_sentencepiece(
            model_path(self._spm_pieces, locales, *self._sampling, self._roots),
            lambda: training_sentences(locales, *self._sampling, self._roots), self._spm_pieces,
            character_coverage=CHARACTER_COVERAGE,
        )

    def _spec(self) -> tuple:
        return ("gettext", self._spm_pieces, self._extra_ids, self._locales, self._sampling, self._roots)

    def __str__(self) -> str:
        locales = "all locales" if self._locales is None else ", ".join(self._locales)
        return (f"LazyMultilingualVocabulary(gettext pairs of {locales}, pieces={self._spm_pieces}, "
                f"extra_ids={self._extra_ids}, temperature={self._sampling[0]}, max_sentences={self._sampling[1]})")


@gin.configurable
def multilingual_vocabulary(
    vocab_size: int = DEFAULT_PIECES, extra_ids: int = vocabularies.DEFAULT_EXTRA_IDS,
    locales: Sequence[str] | None = None, temperature: float = DEFAULT_TEMPERATURE,
    max_sentences: int = DEFAULT_MAX_SENTENCES,
) -> LazyMultilingualVocabulary:
    """The (shared) gettext vocabulary: `vocab_size` pieces + `extra_ids` sentinels, trained on first use on
    the pairs of `locales` (None: every locale on the machine) sampled with `temperature`."""
    return _shared_vocabulary(vocab_size, extra_ids, None if locales is None else tuple(locales), temperature,
                              max_sentences)


@functools.cache
def _shared_vocabulary(*settings) -> LazyMultilingualVocabulary:
    return LazyMultilingualVocabulary(*settings)


def unknown_rate(vocabulary: seqio.SentencePieceVocabulary, texts: Iterable[str]) -> float:
    """The share of the pieces of `texts` that are unk (id 2), 0 for no pieces."""
    ids = [piece for text in texts for piece in vocabulary.encode(text)]
    return sum(piece == vocabulary.unk_id for piece in ids) / max(len(ids), 1)
