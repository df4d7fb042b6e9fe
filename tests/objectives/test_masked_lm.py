"""BERT masked LM: selection rate, 80/10/10, special ids, whole words, SpanBERT spans, seeds."""

import numpy as np
import pytest
import seqio
from objective_helpers import MASK_ID, NUM_SENTINELS, VOCAB_SIZE, FakeVocabulary, features, run

from ptmjax.data import vocabularies
from ptmjax.objectives import masked_lm as mlm


@pytest.fixture(scope="module")
def vocabulary() -> seqio.Vocabulary:
    return vocabularies.stdlib_sentencepiece_vocabulary()  # trained once (~3 s), then cached


@pytest.fixture(scope="module")
def examples() -> list[np.ndarray]:
    """300 sequences of 60..140 regular ids, with EOS and sentinels sprinkled in (never selected)."""
    rng = np.random.default_rng(0)
    out = []
    for n in rng.integers(60, 140, 300):
        tokens = rng.integers(3, VOCAB_SIZE - NUM_SENTINELS, size=n)
        special = rng.random(n) < 0.05
        tokens[special] = rng.choice([1, VOCAB_SIZE - 1, VOCAB_SIZE - 50], size=special.sum())
        out.append(tokens.astype(np.int32))
    return out


def eligible(tokens: np.ndarray) -> np.ndarray:
    return (tokens > 1) & (tokens < VOCAB_SIZE - NUM_SENTINELS)


def masked(examples, vocabulary, seed: int = 1, **options) -> list[dict[str, np.ndarray]]:
    options = mlm.MaskedLMOptions(**options)
    return run(lambda ds: mlm.mask_tokens(ds, vocabulary, options), examples, seed)


def check_consistent(examples, out) -> tuple[int, int]:
    """Shapes, dtypes, targets == original, unselected unchanged, specials never selected."""
    selected = total = 0
    for original, x in zip(examples, out, strict=True):
        assert set(x) == {"inputs", "targets", "loss_mask"}
        assert all(v.dtype == np.int32 and v.shape == original.shape for v in x.values())
        assert (x["targets"] == original).all()
        sel = x["loss_mask"].astype(bool)
        assert not (sel & ~eligible(original)).any(), "a special id was selected"
        assert (x["inputs"][~sel] == original[~sel]).all()
        selected += sel.sum()
        total += eligible(original).sum()
    return selected, total


def split_rates(out) -> tuple[float, float, float]:
    """Fractions of the selected tokens that became MASK, a random other id, or stayed."""
    inputs = np.concatenate([x["inputs"][x["loss_mask"] == 1] for x in out])
    targets = np.concatenate([x["targets"][x["loss_mask"] == 1] for x in out])
    is_mask = inputs == MASK_ID
    is_same = inputs == targets
    return is_mask.mean(), (~is_mask & ~is_same).mean(), is_same.mean()


def words(tokens: np.ndarray, starts: np.ndarray) -> list[np.ndarray]:
    """Index arrays of the words of the eligible tokens (as the module defines them)."""
    ok = eligible(tokens)
    groups, current = [], []
    for i, token in enumerate(tokens):
        if not ok[i]:
            current = []
            continue
        if starts[token] or not current:
            current = [i]
            groups.append(current)
        else:
            current.append(i)
    return [np.array(g) for g in groups]


def test_token_masking_rates(examples):
    out = masked(examples, FakeVocabulary())
    selected, total = check_consistent(examples, out)
    assert abs(selected / total - 0.15) < 0.015, selected / total
    mask, random, same = split_rates(out)
    assert abs(mask - 0.8) < 0.03 and abs(random - 0.1) < 0.03 and abs(same - 0.1) < 0.03, (mask, random, same)
    replaced = np.concatenate([x["inputs"][(x["loss_mask"] == 1) & (x["inputs"] != x["targets"])] for x in out])
    assert ((replaced == MASK_ID) | ((replaced >= 3) & (replaced < VOCAB_SIZE - NUM_SENTINELS))).all()


def test_exact_budget_per_example(examples):
    out = masked(examples, FakeVocabulary())
    for original, x in zip(examples, out, strict=True):
        n = eligible(original).sum()
        assert x["loss_mask"].sum() == max(1, round(0.15 * n))


def test_mask_id_and_rates_are_parameters(examples):
    rates = mlm.MaskingRates(mask_id=4, mask_rate=1.0, random_rate=0.0, select_rate=0.3)
    out = masked(examples[:100], FakeVocabulary(), rates=rates)
    selected, total = check_consistent(examples[:100], out)
    assert abs(selected / total - 0.3) < 0.02
    assert all((x["inputs"][x["loss_mask"] == 1] == 4).all() for x in out)


def test_whole_word_masking(examples, vocabulary):
    starts = mlm.word_start_table(vocabulary)
    assert starts[vocabulary.encode("the")[-1]] and not starts[vocabulary.encode("ing")[-1]]
    out = masked(examples, vocabulary, masking="whole_word")
    selected, total = check_consistent(examples, out)
    assert abs(selected / total - 0.15) < 0.015, selected / total
    partial = 0
    for original, x in zip(examples, out, strict=True):
        for word in words(original, starts):
            partial += len(set(x["loss_mask"][word].tolist())) > 1
    assert partial == 0, "a word was selected in part"
    mask, random, same = split_rates(out)
    assert abs(mask - 0.8) < 0.03 and abs(random - 0.1) < 0.03 and abs(same - 0.1) < 0.03


def test_span_length_distribution():
    p, top = 0.2, 10
    weights = [p * (1 - p) ** (k - 1) for k in range(1, top + 1)]
    renormalized_mean = sum(k * w for k, w in enumerate(weights, start=1)) / sum(weights)  # 3.797
    clipped_mean = sum((1 - p) ** k for k in range(top))  # E[min(Geometric, 10)] = 4.463
    for tail, expected in (("renormalize", renormalized_mean), ("clip", clipped_mean)):
        probs = mlm.span_length_probabilities(p, top, tail)
        lengths = mlm.sample_span_lengths(20000, [3, 4], probs).numpy()
        assert lengths.min() == 1 and lengths.max() == top
        assert abs(lengths.mean() - expected) < 0.06, (tail, lengths.mean(), expected)
    assert abs(renormalized_mean - 3.797) < 1e-3 and abs(clipped_mean - 4.463) < 1e-3


def runs_of(mask: np.ndarray) -> list[int]:
    padded = np.concatenate([[0], mask, [0]])
    edges = np.flatnonzero(np.diff(padded))
    return (edges[1::2] - edges[::2]).tolist()


def test_span_masking_by_tokens(examples):
    out = masked(examples, FakeVocabulary(), masking="span", whole_word_spans=False)
    selected, total = check_consistent(examples, out)
    assert abs(selected / total - 0.15) < 0.015, selected / total
    token_runs = [r for x in masked(examples, FakeVocabulary()) for r in runs_of(x["loss_mask"])]
    span_runs = [r for x in out for r in runs_of(x["loss_mask"])]
    # Spans of mean 3.79 (merged when adjacent, cut at the budget and at special ids) vs. scattered tokens.
    assert np.mean(span_runs) > 2.5 > 1.3 > np.mean(token_runs)


def test_span_masking_by_words(examples, vocabulary):
    starts = mlm.word_start_table(vocabulary)
    out = masked(examples, vocabulary, masking="span")
    selected, total = check_consistent(examples, out)
    assert abs(selected / total - 0.15) < 0.015, selected / total
    for original, x in zip(examples, out, strict=True):
        assert all(len(set(x["loss_mask"][w].tolist())) == 1 for w in words(original, starts))


@pytest.mark.parametrize("masking", mlm.MASKING_KINDS)
def test_deterministic_per_seed_and_dynamic_across_epochs(examples, vocabulary, masking):
    def go(seed, data):
        return [x["loss_mask"].tolist() for x in masked(data, vocabulary, seed=seed, masking=masking)]

    assert go(7, examples[:20]) == go(7, examples[:20])
    assert go(7, examples[:20]) != go(8, examples[:20])
    twice = go(7, examples[:20] * 2)  # a repeated dataset: each epoch masks anew
    assert twice[:20] != twice[20:]


@pytest.mark.parametrize("masking", mlm.MASKING_KINDS)
def test_short_and_special_only_sequences(vocabulary, masking):
    cases = [[], [1], [7], [1, VOCAB_SIZE - 1, 0], [7, 8]]
    out = masked(cases, vocabulary, masking=masking)
    last = [1, 0] if out[4]["loss_mask"][0] else [0, 1]  # one of the two (budget max(1, round(0.3)) = 1)
    assert [x["loss_mask"].tolist() for x in out] == [[], [0], [1], [0, 0, 0], last]
    assert [x["targets"].tolist() for x in out] == cases


def test_bert_mlm_chain_lengths_and_eos(examples):
    out = run(lambda ds: mlm.bert_mlm(ds, {"inputs": 64}, features(), documents_per_stream=8), examples[:40], 2)
    streams = [np.concatenate(examples[i : i + 8]) for i in range(0, 40, 8)]
    expected_lengths = [min(63, len(s) - i) + 1 for s in streams for i in range(0, len(s), 63)]  # + EOS
    assert [len(x["targets"]) for x in out] == expected_lengths and max(expected_lengths) == 64
    for x in out:
        assert {k: v.dtype for k, v in x.items()} == {"inputs": np.int32, "targets": np.int32, "loss_mask": np.int32}
        assert len(x["inputs"]) == len(x["targets"]) == len(x["loss_mask"])
    for x in out:
        assert x["targets"][-1] == 1 and x["inputs"][-1] == 1 and x["loss_mask"][-1] == 0


def test_gin_configures_bert_mlm(examples):
    import gin

    with gin.unlock_config():
        gin.clear_config()
        gin.bind_parameter("ptmjax.objectives.masked_lm.MaskingRates.select_rate", 0.5)
    try:
        out = run(lambda ds: mlm.bert_mlm(ds, {"inputs": 64}, features()), examples[:40], 2)
        selected, total = check_consistent([x["targets"] for x in out], out)
        assert abs(selected / total - 0.5) < 0.02
    finally:
        gin.clear_config()


def test_bad_parameters_are_named(vocabulary):
    import tensorflow as tf

    empty = tf.data.Dataset.from_tensors({"targets": tf.constant([5], tf.int32)})
    with pytest.raises(ValueError, match="unknown masking 'words'"):
        mlm.MaskedLMOptions(masking="words")
    with pytest.raises(ValueError, match="mask_rate \\+ random_rate"):
        mlm.MaskingRates(mask_rate=0.95, random_rate=0.1)
    with pytest.raises(ValueError, match="needs a SentencePiece vocabulary"):
        mlm.mask_tokens(empty, FakeVocabulary(), mlm.MaskedLMOptions(masking="whole_word"))
    with pytest.raises(ValueError, match="mask_id=1 "):
        mlm.mask_tokens(empty, FakeVocabulary(), mlm.MaskedLMOptions(rates=mlm.MaskingRates(mask_id=1)))
    with pytest.raises(ValueError, match="span_p=0"):
        mlm.span_length_probabilities(0.0, 10)
    with pytest.raises(ValueError, match="needs sequence_length\\['inputs'\\]"):
        mlm.bert_mlm(empty, {"targets": 8}, features())
