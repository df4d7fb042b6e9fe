"""Vocabularies: a SentencePiece model trained lazily on the embedded corpus, or bytes.

`stdlib_sentencepiece_vocabulary()` returns a `seqio.SentencePieceVocabulary`
whose model file does not exist yet: the unigram model is trained from the
stdlib corpus (`ptmjax.data.corpus`) the first time the vocabulary is used
(its `_model_context` is the single place seqio loads the model file, so that
is the hook), then cached on disk at
`$PTMJAX_CACHE_DIR/spm/stdlib_unigram_{vocab_size}_{fingerprint16}.model`
(default cache dir `~/.cache/ptmjax`). The file is written to a temporary name
and renamed atomically, under an exclusive file lock, so concurrent processes
train at most once and never read a half-written model.

Ids follow T5: pad=0, eos=1, unk=2, no bos; seqio appends `extra_ids` sentinels
at the end, `<extra_id_0>` being the highest id. The default (2000 pieces +
100 sentinels) has `vocab_size == 2100`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import pathlib
import tempfile
from collections.abc import Callable, Iterable, Iterator

import gin
import sentencepiece as spm
import seqio

from ptmjax.data import corpus

DEFAULT_SPM_PIECES = 2000
DEFAULT_EXTRA_IDS = 100
CACHE_DIR_ENV = "PTMJAX_CACHE_DIR"
_TRAINER_VERSION = "v2"  # bump when the trainer arguments below change


def cache_dir() -> pathlib.Path:
    """The cache root: $PTMJAX_CACHE_DIR, else ~/.cache/ptmjax."""
    return pathlib.Path(os.environ.get(CACHE_DIR_ENV) or pathlib.Path.home() / ".cache" / "ptmjax")


def stdlib_sentencepiece_path(vocab_size: int = DEFAULT_SPM_PIECES) -> pathlib.Path:
    """Where the stdlib model of `vocab_size` pieces is (or will be) cached."""
    key = f"{_TRAINER_VERSION}-{vocab_size}-{corpus.corpus_fingerprint('train')}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / "spm" / f"stdlib_unigram_{vocab_size}_{digest}.model"


def _training_sentences() -> Iterator[str]:
    """Paragraphs of the train split: sentencepiece skips inputs over 4192 bytes."""
    for document in corpus.stdlib_docstrings("train"):
        for paragraph in document.split("\n\n"):
            if paragraph.strip():
                yield paragraph


@contextlib.contextmanager
def _exclusive_lock(path: pathlib.Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def check_vocab_size(vocab_size: int) -> None:
    """A SentencePiece model needs at least 16 pieces."""
    if vocab_size < 16:
        raise ValueError(
            f"vocab_size={vocab_size} is too small for a SentencePiece model; use at least 16 (default 2000)"
        )


def train_cached_sentencepiece(
    path: pathlib.Path, sentences: Callable[[], Iterable[str]], vocab_size: int, **trainer_options
) -> pathlib.Path:
    """Returns `path`, training a unigram model of `vocab_size` pieces on `sentences()` first if it is absent
    (T5's special ids; `trainer_options` override SentencePieceTrainer's other arguments)."""
    check_vocab_size(vocab_size)
    if path.exists():
        return path
    with _exclusive_lock(path.with_suffix(".lock")):
        if path.exists():  # another process trained it while we waited
            return path
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".training-") as tmp:
            prefix = os.path.join(tmp, "model")
            options = {"character_coverage": 1.0, "num_threads": 2, "minloglevel": 2, **trainer_options}
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences()), model_prefix=prefix, model_type="unigram",
                vocab_size=vocab_size, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, **options,
            )
            os.replace(prefix + ".model", path)
    return path


def train_stdlib_sentencepiece(vocab_size: int = DEFAULT_SPM_PIECES) -> pathlib.Path:
    """Returns the cached model path, training the unigram model first if absent."""
    check_vocab_size(vocab_size)  # before the path, which reads the corpus
    return train_cached_sentencepiece(stdlib_sentencepiece_path(vocab_size), _training_sentences, vocab_size)


class LazySentencePieceVocabulary(seqio.SentencePieceVocabulary):
    """A seqio SentencePiece vocabulary whose model is trained on first use.

    Equality (which seqio uses to check mixtures) compares the training spec,
    not the not-yet-known file path.
    """

    def __init__(self, vocab_size: int = DEFAULT_SPM_PIECES, extra_ids: int = DEFAULT_EXTRA_IDS):
        super().__init__(sentencepiece_model_file="", extra_ids=extra_ids)
        self._spm_pieces = vocab_size

    def _trained_model(self) -> pathlib.Path:
        """Trains (or finds) the model file: subclasses train on other text."""
        return train_stdlib_sentencepiece(self._spm_pieces)

    def _model_context(self):  # returns seqio's private _ModelContext
        if not self._sentencepiece_model_file:
            self._sentencepiece_model_file = str(self._trained_model())
        return super()._model_context()

    @property
    def sentencepiece_model_file(self) -> str:
        self._model_context()
        return self._sentencepiece_model_file

    def _spec(self) -> tuple[str, int, int]:
        return ("stdlib", self._spm_pieces, self._extra_ids)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LazySentencePieceVocabulary) and self._spec() == other._spec()

    def __hash__(self) -> int:
        return hash(self._spec())

    def __str__(self) -> str:
        return f"LazySentencePieceVocabulary(stdlib, pieces={self._spm_pieces}, extra_ids={self._extra_ids})"


@functools.cache
def stdlib_sentencepiece_vocabulary(
    vocab_size: int = DEFAULT_SPM_PIECES, extra_ids: int = DEFAULT_EXTRA_IDS
) -> LazySentencePieceVocabulary:
    """The (shared) lazily trained stdlib vocabulary: `vocab_size + extra_ids` ids."""
    return LazySentencePieceVocabulary(vocab_size, extra_ids)


def byte_vocabulary(extra_ids: int = DEFAULT_EXTRA_IDS) -> seqio.ByteVocabulary:
    """UTF-8 bytes (ids 3..258) after pad/eos/unk, then `extra_ids` sentinels."""
    return seqio.ByteVocabulary(extra_ids=extra_ids)


VOCABULARY_KINDS = ("sentencepiece", "byte")


@gin.configurable
def default_vocabulary(
    kind: str = "sentencepiece",
    spm_vocab_size: int = DEFAULT_SPM_PIECES,
    extra_ids: int = DEFAULT_EXTRA_IDS,
) -> seqio.Vocabulary:
    """The vocabulary of the built-in tasks.

    Args:
      kind: 'sentencepiece' (unigram model trained on the stdlib corpus) or
        'byte' (seqio.ByteVocabulary, nothing to train).
      spm_vocab_size: number of SentencePiece pieces (ignored for 'byte').
      extra_ids: number of sentinel ids appended at the end of the vocabulary.
    """
    if kind == "sentencepiece":
        return stdlib_sentencepiece_vocabulary(spm_vocab_size, extra_ids)
    if kind == "byte":
        return byte_vocabulary(extra_ids)
    raise ValueError(f"unknown vocabulary kind {kind!r}; known: {', '.join(VOCABULARY_KINDS)}")
