"""Learning-rate schedules against hand-computed values."""

import math

import pytest

from ptmjax.training.schedules import rsqrt_with_warmup, warmup_cosine


def test_rsqrt_is_constant_then_inverse_sqrt():
    schedule = rsqrt_with_warmup(peak_learning_rate=0.01, warmup_steps=10_000)
    assert float(schedule(0)) == pytest.approx(0.01)
    assert float(schedule(9_999)) == pytest.approx(0.01)
    # T5: 1 / sqrt(step) after warmup, i.e. 0.01 * sqrt(1e4 / 4e4) at step 40k.
    assert float(schedule(40_000)) == pytest.approx(1 / math.sqrt(40_000), rel=1e-6)


def test_rsqrt_linear_warmup_ramps_from_zero():
    schedule = rsqrt_with_warmup(peak_learning_rate=1.0, warmup_steps=100, linear_warmup=True)
    assert float(schedule(0)) == pytest.approx(0.01)
    assert float(schedule(49)) == pytest.approx(0.5)
    assert float(schedule(99)) == pytest.approx(1.0)


def test_warmup_cosine_endpoints():
    schedule = warmup_cosine(peak_learning_rate=2.0, warmup_steps=10, total_steps=110, final_fraction=0.1)
    assert float(schedule(0)) == pytest.approx(0.0)
    assert float(schedule(10)) == pytest.approx(2.0)
    assert float(schedule(60)) == pytest.approx(0.2 + 0.5 * 1.8)  # halfway down the cosine
    assert float(schedule(110)) == pytest.approx(0.2)


def test_bad_schedules_are_rejected():
    with pytest.raises(ValueError, match="warmup_steps"):
        rsqrt_with_warmup(warmup_steps=0)
    with pytest.raises(ValueError, match="total_steps"):
        warmup_cosine(warmup_steps=100, total_steps=50)
