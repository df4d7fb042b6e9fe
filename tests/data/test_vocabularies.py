"""Vocabularies: lazily trained, cached SentencePiece over the corpus; bytes fallback."""

import copy
import os
import pickle
import subprocess
import sys

import pytest
import tensorflow as tf

from ptmjax.data import corpus, vocabularies


@pytest.fixture(scope="module")
def vocab():
    return vocabularies.default_vocabulary()


def test_size_special_ids_and_sentinels_at_the_end(vocab):
    assert vocab.vocab_size == 2100
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
    assert vocab.tokenizer.id_to_piece([0, 1, 2]) == ["<pad>", "</s>", "<unk>"]
    assert vocab.tokenizer.id_to_piece(2099) == "▁<extra_id_0>"
    assert vocab.tokenizer.id_to_piece(2000) == "▁<extra_id_99>"
    assert vocab.tokenizer.id_to_piece(1999).find("extra_id") < 0


def test_round_trip_on_held_out_text(vocab):
    paragraphs = [p for d in corpus.stdlib_docstrings("validation") for p in d.split("\n\n") if p.isascii()]
    assert len(paragraphs) > 50
    for text in paragraphs:
        ids = vocab.encode(text)
        assert 2 not in ids, text  # no unknown pieces in ASCII text
        assert vocab.decode(ids) == " ".join(text.split())  # whitespace runs are normalised
    text = paragraphs[0]
    assert vocab.encode_tf(tf.constant(text)).numpy().tolist() == vocab.encode(text)


def test_learned_pieces_compress_text(vocab):
    text = "\n".join(corpus.stdlib_docstrings("validation"))
    assert len(vocab.encode(text)) < 0.4 * len(text)  # bytes would give 1.0


def test_trained_on_first_use_then_loaded_from_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PTMJAX_CACHE_DIR", str(tmp_path))
    path = vocabularies.stdlib_sentencepiece_path(300)
    lazy = vocabularies.LazySentencePieceVocabulary(300, extra_ids=10)
    assert not path.exists()  # constructing does not train
    assert lazy.vocab_size == 310 and path.exists()
    stat = path.stat()
    again = vocabularies.LazySentencePieceVocabulary(300, extra_ids=10)
    assert again.vocab_size == 310 and again.sentencepiece_model_file == str(path)
    assert vocabularies.train_stdlib_sentencepiece(300) == path
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == (stat.st_mtime_ns, stat.st_ino)  # not retrained
    assert [p.name for p in path.parent.iterdir() if p.suffix == ".model"] == [path.name]  # no temp leftovers


@pytest.mark.slow
def test_importing_the_registry_does_not_train(tmp_path):
    env = {**os.environ, "PTMJAX_CACHE_DIR": str(tmp_path)}
    code = ("import ptmjax.tasks.pretraining, seqio; "
            "print(sorted(n for n in seqio.TaskRegistry.names() if 'ptmjax' in n))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "ptmjax_c4_span_corruption" in out.stdout and "ptmjax_stdlib_span_corruption" in out.stdout
    assert list(tmp_path.rglob("*.model")) == []


def test_picklable_and_equal_by_spec(vocab):
    assert pickle.loads(pickle.dumps(vocab)) == vocab == copy.deepcopy(vocab)
    assert vocab != vocabularies.LazySentencePieceVocabulary(2000, extra_ids=50)


def test_byte_fallback():
    byte = vocabularies.default_vocabulary("byte")
    assert byte.vocab_size == 259 + 100
    assert byte.encode("hé") == [ord("h") + 3, 0xC3 + 3, 0xA9 + 3]
    assert byte.decode(byte.encode("Return the value.")) == "Return the value."


def test_unknown_kind_is_named():
    with pytest.raises(ValueError, match="unknown vocabulary kind 'bpe'"):
        vocabularies.default_vocabulary("bpe")
