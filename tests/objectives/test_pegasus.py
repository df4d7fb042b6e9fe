"""PEGASUS gap sentences: ROUGE-1 by hand, the count, the top-scored choice, reconstruction, seeds."""

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
import tensorflow as tf
from objective_helpers import END, MASK_ID, FakeVocabulary, as_lists, features, run, sentences

from ptmjax.objectives import bart_noising, pegasus


@pytest.fixture(scope="module")
def documents() -> list[np.ndarray]:
    """Ids from a small range (so sentences share words, and scores tie), about 8 tokens per sentence."""
    rng = np.random.default_rng(5)
    out = []
    for n in rng.integers(5, 160, size=300):
        tokens = rng.integers(5, 40, size=n)
        tokens[rng.random(n) < 0.12] = END
        out.append(tokens.astype(np.int32))
    return out


def generate(documents, seed: int = 1, **options) -> list[dict[str, list[int]]]:
    options = pegasus.GapSentenceOptions(**{"sentence_end_ids": [END], **options})
    return as_lists(run(lambda ds: pegasus.gap_sentence_generation(ds, FakeVocabulary(), options), documents, seed))


@pytest.fixture(scope="module")
def principal(documents) -> list[dict[str, list[int]]]:
    return generate(documents)


def rouge1_f1(sentence: tuple[int, ...], rest: list[int]) -> Fraction:
    """ROUGE-1 F1 from precision and recall, exactly."""
    overlap = sum((Counter(sentence) & Counter(rest)).values())
    if not overlap:
        return Fraction(0)
    precision, recall = Fraction(overlap, len(sentence)), Fraction(overlap, len(rest))
    return 2 * precision * recall / (precision + recall)


def fill_masks(inputs: list[int], targets: list[int]) -> tuple[list[int], list[int]]:
    """(the original, the indices of the gap sentences): each mask takes the next sentence of the targets."""
    gaps = iter(sentences(targets))
    out, gap_indices = [], []
    for token in inputs:
        if token == MASK_ID:
            gap_indices.append(len(sentences(out)) if not out or out[-1] == END else None)
            out.extend(next(gaps))
        else:
            out.append(token)
    assert next(gaps, None) is None, "every gap sentence fills a mask"
    assert None not in gap_indices, "a mask stands for a whole sentence"
    return out, gap_indices


def test_rouge1_f1_by_hand():
    # A = [5 6 .], B = [5 5 7 .], C = [6 8]; '.' = END.
    # A vs B+C: overlap 5, 6, . = 3; P = 3/3, R = 3/6 -> F1 = 2 * 1 * 0.5 / 1.5 = 2/3.
    # B vs A+C: overlap 5 (once), . = 2; P = 2/4, R = 2/5 -> F1 = 2 * 0.2 / 0.9 = 4/9.
    # C vs A+B: overlap 6 = 1; P = 1/2, R = 1/7 -> F1 = (1/7) / (9/14) = 2/9.
    tokens = tf.constant([5, 6, END, 5, 5, 7, END, 6, 8])
    sentence_id, num = bart_noising.sentence_ids(tokens, tf.constant(bart_noising.ids_table([END], 100)))
    assert sentence_id.numpy().tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2] and int(num) == 3
    scores = pegasus.sentence_rouge1_f1(tokens, sentence_id, num).numpy()
    np.testing.assert_allclose(scores, [2 / 3, 4 / 9, 2 / 9], rtol=1e-6)
    assert rouge1_f1((5, 6, END), [5, 5, 7, END, 6, 8]) == Fraction(2, 3)


def test_reconstruction_and_the_count(documents, principal):
    masked = total = 0
    for document, x in zip(documents, principal, strict=True):
        original, gaps = fill_masks(x["inputs"], x["targets"])
        assert original == document.tolist()
        num_sentences = len(sentences(original))
        assert len(gaps) == max(1, round(0.3 * num_sentences))
        masked, total = masked + len(gaps), total + num_sentences
    assert abs(masked / total - 0.3) < 0.02, masked / total


def test_the_gap_sentences_are_the_top_scored(documents, principal):
    for document, x in zip(documents, principal, strict=True):
        parts = sentences(document.tolist())
        scores = [rouge1_f1(s, [t for j, p in enumerate(parts) if j != i for t in p]) for i, s in enumerate(parts)]
        best = sorted(range(len(parts)), key=lambda i: (-scores[i], i))  # ties: the earlier sentence
        _, gaps = fill_masks(x["inputs"], x["targets"])
        assert gaps == sorted(best[: len(gaps)])  # and the targets keep document order


def test_lead_and_random_strategies(documents):
    for x in generate(documents[:50], strategy="lead"):
        _, gaps = fill_masks(x["inputs"], x["targets"])
        assert gaps == list(range(len(gaps)))
    chosen = Counter()
    first = generate(documents, strategy="random")
    for document, x in zip(documents, first, strict=True):
        _, gaps = fill_masks(x["inputs"], x["targets"])
        chosen.update(g / len(sentences(document.tolist())) for g in gaps)
    positions = np.repeat(list(chosen), list(chosen.values()))
    assert abs(positions.mean() - 0.45) < 0.05  # uniform over sentences: mean relative position (S - 1) / 2S
    assert first[:30] == generate(documents[:30], strategy="random")
    assert first[:30] != generate(documents[:30], seed=2, strategy="random")


def test_pegasus_chain_cuts_each_document(documents):
    lengths, options = {"inputs": 64}, pegasus.GapSentenceOptions(sentence_end_ids=[END])
    out = as_lists(run(lambda ds: pegasus.pegasus(ds, lengths, features(), options), documents, 0))
    pieces = [fill_masks(x["inputs"], x["targets"])[0] for x in out]
    assert max(map(len, pieces)) == 63  # room for EOS
    expected = [d[i : i + 63].tolist() for d in documents for i in range(0, len(d), 63)]
    assert pieces == expected


def test_bad_parameters_are_named():
    empty = tf.data.Dataset.from_tensors({"targets": tf.constant([5], tf.int32)})
    with pytest.raises(ValueError, match="unknown gap-sentence strategy 'best'"):
        pegasus.GapSentenceOptions(strategy="best")
    with pytest.raises(ValueError, match="gap_sentences_ratio=0"):
        pegasus.GapSentenceOptions(gap_sentences_ratio=0)
    with pytest.raises(ValueError, match="pass sentence_end_ids"):
        pegasus.gap_sentence_generation(empty, FakeVocabulary(), pegasus.GapSentenceOptions())
