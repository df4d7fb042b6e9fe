"""MPNet's objective: the layout of each row, the predicted fraction, uniform orders, the mask tokens' rates."""

import itertools
import math

import numpy as np
import pytest
from objective_helpers import MASK_ID, NUM_SENTINELS, VOCAB_SIZE, features, random_examples, run

from ptmjax.objectives import masked_permuted_lm

LENGTHS = {"inputs": 64, "targets": 9}


def mpnet_rows(examples, lengths=LENGTHS, seed: int = 1, **options):
    options = masked_permuted_lm.MaskedPermutedLMOptions(**options)
    return run(lambda ds: masked_permuted_lm.masked_permuted_lm(ds, lengths, features(), options), examples, seed)


@pytest.fixture(scope="module")
def examples():
    return random_examples(200, 40, 120)


def test_rows_are_the_permuted_text_then_the_masks_at_the_predicted_positions(examples):
    out = mpnet_rows(examples)
    options = masked_permuted_lm.MaskedPermutedLMOptions()
    n_full = options.text_length(64, 9)
    assert (n_full, options.num_predicted(n_full)) == (56, 8)  # 56 + round(8.4) = 64; 57 + round(8.55) = 66
    stream, start, predicted, total = np.concatenate(examples), 0, 0, 0
    for x in out:
        assert set(x) == {"inputs", "positions", "targets", "loss_mask"}
        b = len(x["targets"])
        n = len(x["inputs"]) - b
        assert n <= n_full and b == options.num_predicted(n) and x["positions"].shape == (n + b,)
        order = x["positions"][:n]
        assert sorted(order) == list(range(n))  # the positions of the content are a permutation
        text = np.empty(n, np.int32)
        text[order] = x["inputs"][:n]  # the content holds the text, permuted
        assert (text == stream[start:start + n]).all()  # no EOS: id 1 is Hugging Face MPNet's padding
        start += n
        assert (x["targets"] == x["inputs"][n - b:n]).all()  # the order's tail is predicted
        assert (x["positions"][n:] == order[n - b:]).all()  # its mask tokens stand at its positions
        assert (x["loss_mask"] == 1).all()
        assert abs(b - 0.15 * n) <= 0.5 or b == 1  # round(0.15 n), at least one
        predicted, total = predicted + b, total + n
    assert start == len(stream)
    assert abs(predicted / total - 8 / 56) < 0.002, predicted / total  # nearly all pieces are full


def test_orders_are_uniform_and_the_predicted_ones_are_the_last_of_them():
    """Over 3000 three-token pieces (one predicted), all 3! orders appear about equally often."""
    out = mpnet_rows([np.arange(10, 10 + 3 * 3000)], {"inputs": 4, "targets": 1}, predict_fraction=0.3,
                     mask_rate=1.0, random_rate=0.0)
    counts = {perm: 0 for perm in itertools.permutations(range(3))}
    for x in out:
        assert list(x["inputs"][3:]) == [MASK_ID] and x["positions"][3] == x["positions"][2]
        counts[tuple(int(p) for p in x["positions"][:3])] += 1
    expected = len(out) / math.factorial(3)
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert len(out) == 3000 and chi2 < 20.5, counts  # 5 degrees of freedom, p ~ 0.001


def test_mask_tokens_are_masks_random_ids_or_kept_at_bert_rates(examples):
    out = mpnet_rows(examples)
    masks = np.concatenate([x["inputs"][len(x["inputs"]) - len(x["targets"]):] for x in out])
    targets = np.concatenate([x["targets"] for x in out])
    is_mask, kept = masks == MASK_ID, masks == targets
    replaced = ~is_mask & ~kept
    assert len(masks) > 2000
    for share, want in ((is_mask.mean(), 0.8), (replaced.mean(), 0.1 * (1 - 1 / 1997)), (kept.mean(), 0.1)):
        assert abs(share - want) < 4.5 * math.sqrt(want * (1 - want) / len(masks)), (share, want)
    assert ((masks[replaced] >= 3) & (masks[replaced] < VOCAB_SIZE - NUM_SENTINELS)).all()


def test_deterministic_under_a_seed_and_lengths_that_fit_no_prediction_are_refused(examples):
    first, again, other = (mpnet_rows(examples[:20], seed=s) for s in (3, 3, 4))
    assert all((a[k] == b[k]).all() for a, b in zip(first, again, strict=True) for k in a)
    assert any((a["positions"] != b["positions"]).any() for a, b in zip(first, other, strict=False))
    with pytest.raises(ValueError, match="inputs=64, targets=0 leave no piece"):
        masked_permuted_lm.MaskedPermutedLMOptions().text_length(64, 0)
    with pytest.raises(ValueError, match="predict_fraction=1.0"):
        masked_permuted_lm.MaskedPermutedLMOptions(predict_fraction=1.0)
