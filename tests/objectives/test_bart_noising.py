"""BART noising: each transformation's rate and inverse, composition, lengths, seeds."""

from collections import Counter

import numpy as np
import pytest
import tensorflow as tf
from objective_helpers import (
    END,
    MASK_ID,
    VOCAB_SIZE,
    FakeVocabulary,
    as_lists,
    features,
    random_examples,
    run,
    sentences,
)

from ptmjax.data import vocabularies
from ptmjax.objectives import bart_noising as bart

OFF = {"permute_sentence_ratio": 0.0, "infill_ratio": 0.0}  # every transformation off


@pytest.fixture(scope="module")
def examples() -> list[np.ndarray]:
    out = random_examples(300, 20, 100, seed=2)
    rng = np.random.default_rng(3)
    for tokens in out:
        tokens[tokens == END] = 5
        tokens[rng.random(len(tokens)) < 0.1] = END  # ~10 tokens per sentence
    return out


def noised(examples, seed: int = 1, **options) -> list[dict[str, list[int]]]:
    options = bart.BartNoiseOptions(**{**OFF, "sentence_end_ids": [END], **options})
    return as_lists(run(lambda ds: bart.noise_tokens(ds, FakeVocabulary(), options), examples, seed))


def expand_masks(inputs: list[int], targets: list[int]) -> bool:
    """Whether each MASK in inputs can stand for a run (maybe empty) of tokens so inputs becomes targets."""
    reachable = {0}  # positions of targets that the inputs read so far can end at
    for token in inputs:
        if token == MASK_ID:
            reachable = set(range(min(reachable), len(targets) + 1)) if reachable else set()
        else:
            reachable = {p + 1 for p in reachable if p < len(targets) and targets[p] == token}
    return len(targets) in reachable


def is_subsequence(short: list[int], long: list[int]) -> bool:
    it = iter(long)
    return all(token in it for token in short)


def test_features_dtypes_and_targets(examples):
    options = bart.BartNoiseOptions(sentence_end_ids=[END])
    out = run(lambda ds: bart.noise_tokens(ds, FakeVocabulary(), options), examples[:50], 0)
    for original, x in zip(examples, out, strict=False):
        assert set(x) == {"inputs", "targets"} and x["inputs"].dtype == x["targets"].dtype == np.int32
        assert (x["targets"] == original).all()


def is_sentence_permutation(inputs: list[int], targets: list[int]) -> bool:
    """Whether inputs concatenate a permutation of the targets' sentences.

    A last sentence without an end token merges with whatever follows it in the
    inputs, so it is looked for at each sentence start of the inputs and cut out.
    """
    parts = sentences(targets)
    if not parts or parts[-1][-1] == END:
        return Counter(sentences(inputs)) == Counter(parts)
    tail, rest = list(parts[-1]), Counter(parts[:-1])
    starts = [0] + [i + 1 for i, t in enumerate(inputs) if t == END]
    return any(
        inputs[s : s + len(tail)] == tail and Counter(sentences(inputs[:s] + inputs[s + len(tail) :])) == rest
        for s in starts
    )


def test_sentence_permutation_keeps_the_multiset_of_sentences(examples):
    out = noised(examples, permute_sentence_ratio=1.0)
    for x in out:
        assert is_sentence_permutation(x["inputs"], x["targets"])
    assert np.mean([x["inputs"] != x["targets"] for x in out]) > 0.9
    assert not is_sentence_permutation([5, END, 6, 7], [5, END, 7, 6])


def test_partial_sentence_permutation_moves_the_given_fraction(examples):
    ends_with_end = [e for e in examples if e[-1] == END and (e == END).sum() >= 8]
    out = noised(ends_with_end, permute_sentence_ratio=0.5)
    moved = total = 0
    for x in out:
        before, after = sentences(x["targets"]), sentences(x["inputs"])
        assert Counter(before) == Counter(after)
        moved += sum(a != b for a, b in zip(before, after, strict=True))
        total += len(before)
    # Half the sentences are shuffled among themselves; a shuffled one stays put with probability ~1/k.
    assert 0.35 < moved / total <= 0.5, moved / total


def test_sentence_ends_from_the_vocabulary():
    vocabulary = vocabularies.stdlib_sentencepiece_vocabulary()
    table = bart.sentence_end_table(vocabulary)
    tokens = vocabulary.encode("One two. Three four! Five six? Seven")
    is_end = [bool(table[t]) for t in tokens]
    assert sum(is_end) == 3 and is_end[-1] is False


def test_token_masking_rate_and_inverse(examples):
    out = noised(examples, mask_ratio=0.2)
    masked = total = 0
    for x in out:
        inputs, targets = np.array(x["inputs"]), np.array(x["targets"])
        assert len(inputs) == len(targets)
        is_mask = inputs == MASK_ID
        assert (inputs[~is_mask] == targets[~is_mask]).all()  # inverse: fill masks from targets
        assert is_mask.sum() == max(1, round(0.2 * len(targets)))
        masked += is_mask.sum()
        total += len(targets)
    assert abs(masked / total - 0.2) < 0.01


def test_token_deletion_rate_and_inverse(examples):
    out = noised(examples, delete_ratio=0.15)
    deleted = total = 0
    for x in out:
        assert is_subsequence(x["inputs"], x["targets"])
        assert len(x["targets"]) - len(x["inputs"]) == max(1, round(0.15 * len(x["targets"])))
        deleted += len(x["targets"]) - len(x["inputs"])
        total += len(x["targets"])
    assert abs(deleted / total - 0.15) < 0.01


def test_infill_span_lengths_are_poisson():
    lengths = []
    for i in range(10):  # long budgets: stopping at the budget barely biases the earlier spans
        spans = bart.infill_span_lengths(tf.constant(1000), tf.constant([i, 9]), 3.0).numpy()
        assert spans.sum() == 1000 and (spans >= 0).all()
        lengths += spans[:-1].tolist()  # the last is cut to fit
    lengths = np.array(lengths)
    zeros = (lengths == 0).mean()
    assert abs(lengths.mean() - 3.0) < 0.1, lengths.mean()
    assert abs(zeros - np.exp(-3.0)) < 0.015, zeros  # Poisson(3): P(0) = 0.0498
    assert abs(lengths.var() - 3.0) < 0.4, lengths.var()


def test_text_infilling_rate_and_inverse(examples):
    out = noised(examples, infill_ratio=0.3)
    num_masks = noise = total = 0
    for x in out:
        assert expand_masks(x["inputs"], x["targets"]), "the masks cannot be re-expanded into the targets"
        kept = sum(t != MASK_ID for t in x["inputs"])
        assert len(x["targets"]) - kept == max(1, round(0.3 * len(x["targets"])))
        noise += len(x["targets"]) - kept
        num_masks += len(x["inputs"]) - kept
        total += len(x["targets"])
    assert abs(noise / total - 0.3) < 0.01
    # Spans of Poisson(3) (the last cut to fit, so slightly shorter), one MASK each.
    assert 2.4 < noise / num_masks < 3.2, noise / num_masks


def test_expand_masks_rejects_wrong_inputs():
    assert expand_masks([5, MASK_ID, 8], [5, 6, 7, 8]) and expand_masks([MASK_ID, 5], [5])
    assert not expand_masks([5, MASK_ID, 9], [5, 6, 7, 8]) and not expand_masks([6, MASK_ID], [5, 6])


def test_rotation_is_a_rotation(examples):
    out = noised(examples, rotate_probability=1.0)
    starts = []
    for x in out:
        n = len(x["targets"])
        found = [k for k in range(1, n) if x["targets"][k:] + x["targets"][:k] == x["inputs"]]
        assert found, "inputs are not a rotation of the targets"
        starts.append(found[0] / n)
    assert abs(np.mean(starts) - 0.5) < 0.05  # uniform start


def test_rotation_probability(examples):
    out = noised(examples, rotate_probability=0.3)
    rotated = np.mean([x["inputs"] != x["targets"] for x in out])
    assert abs(rotated - 0.3) < 0.08


@pytest.mark.slow
def test_composition_and_seeds(examples):
    config = {"permute_sentence_ratio": 1.0, "mask_ratio": 0.1, "delete_ratio": 0.1, "infill_ratio": 0.2}
    first = noised(examples[:30], seed=4, rotate_probability=0.5, **config)
    assert first == noised(examples[:30], seed=4, rotate_probability=0.5, **config)
    assert first != noised(examples[:30], seed=5, rotate_probability=0.5, **config)
    for x in noised(examples, seed=4, **config):
        n = len(x["targets"])
        deleted = max(1, round(0.1 * n))
        kept = sum(t != MASK_ID for t in x["inputs"])
        # Masking removes ~10%, deletion 10% of what is left, infilling 20% of that.
        after_delete = n - deleted
        assert kept <= after_delete - max(1, round(0.2 * after_delete))
        assert Counter(t for t in x["inputs"] if t != MASK_ID) <= Counter(x["targets"])


def test_bart_noising_chain_and_eos(examples):
    seq = {"inputs": 40, "targets": 40}
    options = bart.BartNoiseOptions(sentence_end_ids=[END])
    out = run(lambda ds: bart.bart_noising(ds, seq, features(), options), examples[:40], 0)
    assert max(len(x["targets"]) for x in out) == 39  # room for EOS
    assert sum(len(x["targets"]) for x in out) == sum(len(e) for e in examples[:40])
    import seqio

    with_eos = seqio.preprocessors.append_eos_after_trim(
        tf.data.Dataset.from_generator(
            lambda: iter(out),
            output_signature={k: tf.TensorSpec([None], tf.int32) for k in ("inputs", "targets")},
        ),
        output_features=features(),
        sequence_length=seq,
    )
    for x in with_eos.as_numpy_iterator():
        assert x["targets"][-1] == x["inputs"][-1] == 1 and len(x["inputs"]) <= 40


def test_bad_parameters_are_named():
    empty = tf.data.Dataset.from_tensors({"targets": tf.constant([5], tf.int32)})
    with pytest.raises(ValueError, match="infill_ratio=1.5"):
        bart.BartNoiseOptions(infill_ratio=1.5)
    with pytest.raises(ValueError, match="poisson_lambda=0"):
        bart.BartNoiseOptions(poisson_lambda=0)
    with pytest.raises(ValueError, match="pass sentence_end_ids"):
        bart.noise_tokens(empty, FakeVocabulary(), bart.BartNoiseOptions())
    with pytest.raises(ValueError, match=f"outside the vocabulary of {VOCAB_SIZE}"):
        bart.noise_tokens(empty, FakeVocabulary(), bart.BartNoiseOptions(sentence_end_ids=[VOCAB_SIZE]))
