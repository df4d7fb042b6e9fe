"""NSP / SOP sentence pairs: layout, token types, labels at their rate, cuts at sentence ends, masking, seeds."""

import numpy as np
import pytest
from objective_helpers import NUM_SENTINELS, VOCAB_SIZE, features, run

from ptmjax.objectives import sentence_pairs

END = 7  # the sentence-end id of these documents
CLS = VOCAB_SIZE - 2
LENGTH = 64


@pytest.fixture(scope="module")
def documents() -> list[np.ndarray]:
    """400 documents of 20..40 distinct-looking ids with sentence ends every 4..9 tokens."""
    rng = np.random.default_rng(0)
    docs = []
    for n in rng.integers(20, 40, 400):
        tokens = rng.integers(10, VOCAB_SIZE - NUM_SENTINELS, size=n)
        position = rng.integers(4, 10)
        while position < n - 1:
            tokens[position] = END
            position += rng.integers(4, 10)
        docs.append(tokens.astype(np.int32))
    return docs


def pairs(documents, kind: str, seed: int = 1, **options):
    options = sentence_pairs.SentencePairOptions(sentence_end_ids=[END], **options)
    return run(
        lambda ds: sentence_pairs.sentence_pair_mlm(ds, {"inputs": LENGTH}, features(), kind, options),
        documents, seed,
    )


def segments(x) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) of an example, checking [CLS] A [SEP] B [SEP] and the token types."""
    tokens, types = x["targets"], x["token_type_ids"]
    assert tokens[0] == CLS and tokens[-1] == 1
    first_sep = int(np.argmax(tokens == 1))
    assert (types[: first_sep + 1] == 0).all() and (types[first_sep + 1 :] == 1).all()
    return tokens[1:first_sep], tokens[first_sep + 1 : -1]


def contains(doc: np.ndarray, part: np.ndarray) -> bool:
    return any((doc[i : i + len(part)] == part).all() for i in range(len(doc) - len(part) + 1))


@pytest.mark.parametrize("kind", ["nsp", "sop"])
def test_pairs_are_laid_out_labelled_and_recoverable(documents, kind):
    out = pairs(documents, kind)
    assert len(out) == len(documents)
    labels = []
    for doc, x in zip(documents, out, strict=True):
        assert set(x) == {"inputs", "targets", "loss_mask", "token_type_ids", "sentence_label"}
        assert all(v.dtype == np.int32 for v in x.values()) and x["sentence_label"].shape == ()
        assert len({x[k].shape for k in ("inputs", "targets", "loss_mask", "token_type_ids")}) == 1
        assert len(x["targets"]) <= LENGTH
        a, b = segments(x)
        assert len(a) and len(b)
        label = int(x["sentence_label"])
        labels.append(label)
        if label == 0:  # in order: A then B is the document, cut just after a sentence end
            assert (np.concatenate([a, b]) == doc).all() and a[-1] == END
        elif kind == "sop":  # swapped
            assert (np.concatenate([b, a]) == doc).all() and b[-1] == END
        else:  # B starts another document
            assert contains(doc, a) and (doc[: len(a)] == a).all()
            others = [d for d in documents if d is not doc and len(d) >= len(b) and (d[: len(b)] == b).all()]
            assert others and not (doc[len(a) : len(a) + len(b)] == b).all()
    assert abs(np.mean(labels) - 0.5) < 0.07, np.mean(labels)


def test_masking_rates_and_specials(documents):
    out = pairs(documents, "nsp")
    selected = eligible = masked = 0
    for x in out:
        sel = x["loss_mask"].astype(bool)
        special = (x["targets"] <= 1) | (x["targets"] >= VOCAB_SIZE - NUM_SENTINELS)
        assert not (sel & special).any(), "[CLS] or [SEP] was selected"
        assert (x["inputs"][~sel] == x["targets"][~sel]).all()
        selected += sel.sum()
        eligible += (~special).sum()
        masked += (x["inputs"][sel] == VOCAB_SIZE - 1).sum()
    assert abs(selected / eligible - 0.15) < 0.01, selected / eligible
    assert abs(masked / selected - 0.8) < 0.04


def test_negative_rate_zero_and_one(documents):
    assert all(int(x["sentence_label"]) == 0 for x in pairs(documents[:50], "sop", negative_rate=0.0))
    assert all(int(x["sentence_label"]) == 1 for x in pairs(documents[:50], "sop", negative_rate=1.0))


def test_deterministic_under_a_seed_and_different_under_another(documents):
    first, again, other = (pairs(documents[:40], "nsp", seed=s) for s in (3, 3, 4))
    same = all((a[k] == b[k]).all() for a, b in zip(first, again, strict=True) for k in a)
    differ = any((a[k] != b[k]).any() for a, b in zip(first, other, strict=True) for k in ("inputs", "loss_mask"))
    assert same and differ


def test_bad_arguments_name_the_fix():
    with pytest.raises(ValueError, match="unknown sentence-pair kind 'xyz'"):
        pairs([np.arange(10, 30)], "xyz")
    with pytest.raises(ValueError, match="cls_id=5 must be a sentinel"):
        pairs([np.arange(10, 30)], "nsp", cls_id=5)
