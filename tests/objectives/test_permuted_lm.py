"""XLNet permuted LM: the ranks are a uniform permutation, the order's last 1/K is predicted, seeds."""

import itertools
import math

import numpy as np
import pytest
from objective_helpers import features, random_examples, run

from ptmjax.objectives import permuted_lm

LENGTH = 48


def permuted(examples, seed: int = 1, **options):
    options = permuted_lm.PermutedLMOptions(**options)
    return run(lambda ds: permuted_lm.permuted_lm(ds, {"inputs": LENGTH}, features(), options), examples, seed)


@pytest.fixture(scope="module")
def examples():
    return random_examples(200, 40, 120)


def test_ranks_are_permutations_and_the_tail_is_predicted(examples):
    out = permuted(examples)
    stream = np.concatenate(examples)
    tokens = np.concatenate([x["targets"] for x in out])
    assert (tokens[tokens != 1] == stream[: (tokens != 1).sum()]).all()  # text intact, EOS after each piece
    predicted = total = 0
    for x in out:
        assert set(x) == {"inputs", "targets", "loss_mask", "permutation_rank"}
        n = len(x["targets"])
        assert n <= LENGTH and all(v.shape == (n,) and v.dtype == np.int32 for v in x.values())
        assert (x["inputs"] == x["targets"]).all()
        assert sorted(x["permutation_rank"]) == list(range(n))
        want = min(max(1, round(n / 6)), n - 1) if n > 1 else 0
        assert x["loss_mask"].sum() == want
        assert (x["permutation_rank"][x["loss_mask"] == 1] >= n - want).all()
        predicted, total = predicted + want, total + n
    assert abs(predicted / total - 1 / 6) < 0.01


def test_orders_are_uniform():
    """Over many 3-token pieces, all 3! orders appear about equally often."""
    out = run(
        lambda ds: permuted_lm.permuted_lm(ds, {"inputs": 3}, features(add_eos=False)),
        [np.arange(10, 10 + 3 * 3000)], seed=1,
    )
    counts = {perm: 0 for perm in itertools.permutations(range(3))}
    for x in out:
        counts[tuple(int(r) for r in x["permutation_rank"])] += 1
    expected = len(out) / math.factorial(3)
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert len(out) == 3000 and chi2 < 20.5, counts  # 5 degrees of freedom, p ~ 0.001


def test_deterministic_under_a_seed_and_different_under_another(examples):
    first, again, other = (permuted(examples[:20], seed=s) for s in (3, 3, 4))
    assert all((a[k] == b[k]).all() for a, b in zip(first, again, strict=True) for k in a)
    assert any((a["permutation_rank"] != b["permutation_rank"]).any() for a, b in zip(first, other, strict=True))


def test_bad_fraction_names_it():
    with pytest.raises(ValueError, match="predict_fraction=0.0"):
        permuted([np.arange(10, 30)], predict_fraction=0.0)
