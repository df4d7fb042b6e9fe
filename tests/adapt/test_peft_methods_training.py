"""Each parameter-efficient method trains with the Trainer and `trainable=[its pattern]`: the loss falls on a tiny
task while every other parameter stays bit-identical."""

from __future__ import annotations

import re

import numpy as np
import pytest
from peft_training_runs import METHODS, train

from ptmjax.tree_paths import leaves_by_path


@pytest.mark.parametrize("method", list(METHODS))
def test_training_only_the_methods_parameters_lowers_the_loss(method):
    initial, final, losses = train(method)
    assert losses[-1] < 0.9 * losses[0] and all(np.diff(losses[:5]) < 0), losses
    pattern = METHODS[method][2]
    moved = {path for (path, a), (_, b) in zip(leaves_by_path(initial), leaves_by_path(final), strict=True)
             if not np.array_equal(a, b)}
    assert moved and all(re.search(pattern, path) for path in moved), sorted(moved)
