"""The embedded stdlib-docstring corpus: deterministic, split, real English."""

import inspect
import json
import os
import subprocess
import sys

import pytest

from ptmjax.data import corpus


def test_splits_are_disjoint_non_empty_and_roughly_95_5():
    train, validation = corpus.stdlib_docstrings("train"), corpus.stdlib_docstrings("validation")
    assert len(train) > 1000 and len(validation) > 20
    assert not set(train) & set(validation)
    assert len(set(train)) == len(train)  # deduplicated
    assert 0.03 < len(validation) / (len(train) + len(validation)) < 0.08
    assert all(corpus.split_of(d) == "validation" for d in validation)
    assert min(map(len, train + validation)) >= corpus.MIN_CHARS


def test_contains_known_docstrings():
    everything = set(corpus.stdlib_docstrings("train") + corpus.stdlib_docstrings("validation"))
    assert inspect.cleandoc(json.dumps.__doc__) in everything
    assert inspect.cleandoc(json.__doc__) in everything


def test_is_english_prose():
    train = corpus.stdlib_docstrings("train")
    words = " ".join(train).lower().split()
    for common in ("the", "of", "and", "a", "is", "to", "return", "if"):
        assert words.count(common) > 500, common
    assert sum(" the " in d for d in train) / len(train) > 0.5
    size = corpus.corpus_size("train")
    assert size["documents"] == len(train) and size["characters"] > 300_000


def test_same_documents_in_a_fresh_process_with_another_hash_seed():
    code = (
        "from ptmjax.data import corpus; "
        "print(corpus.corpus_fingerprint('train'), corpus.corpus_fingerprint('validation'))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [corpus.corpus_fingerprint("train"), corpus.corpus_fingerprint("validation")]


def test_dataset_fn_yields_the_split_and_shuffles_deterministically():
    texts = [x["text"].decode() for x in corpus.stdlib_dataset_fn("validation", False).as_numpy_iterator()]
    assert texts == list(corpus.stdlib_docstrings("validation"))
    shuffled = [x["text"].decode() for x in corpus.stdlib_dataset_fn("validation", True, seed=3).as_numpy_iterator()]
    again = [x["text"].decode() for x in corpus.stdlib_dataset_fn("validation", True, seed=3).as_numpy_iterator()]
    assert shuffled == again and shuffled != texts and sorted(shuffled) == sorted(texts)


def test_unknown_split_is_named():
    with pytest.raises(ValueError, match="unknown split 'test'.*train, validation"):
        corpus.stdlib_docstrings("test")


def test_libraries_patching_the_stdlib_do_not_change_the_corpus(monkeypatch):
    """transformers adds documented methods to logging.Logger; the corpus must not see them."""
    import logging

    want = corpus.corpus_fingerprint("train")

    def warning_advice(self):
        """A method that a third-party library adds to the standard library's Logger class."""

    monkeypatch.setattr(logging.Logger, "warning_advice", warning_advice, raising=False)
    for cached in (corpus._all_documents, corpus.stdlib_docstrings):
        cached.cache_clear()
    assert corpus.corpus_fingerprint("train") == want


def test_an_extraction_started_in_the_background_gives_the_same_documents():
    want = corpus._all_documents()
    corpus._all_documents.cache_clear()
    corpus.extract_in_background()
    corpus.extract_in_background()  # one is running: no second one
    assert len(corpus._started) == 1
    assert corpus._all_documents() == want
    assert not corpus._started
    corpus.extract_in_background()  # already read: nothing to start
    assert not corpus._started
