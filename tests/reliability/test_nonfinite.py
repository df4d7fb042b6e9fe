"""A NaN loss stops the run (or is skipped), and no non-finite state reaches a checkpoint."""

import re

import jax.numpy as jnp
import pytest
from reliability_helpers_a import (
    all_finite,
    assert_trees_equal,
    poison_steps,
    records,
    run,
    saved_checkpoint,
    saved_steps,
)

from ptmjax.storage.checkpoints import Checkpointer
from ptmjax.training.nonfinite import NonFiniteError, NonFiniteMonitor, NonFinitePolicy


def test_a_nan_loss_stops_the_run_naming_the_step_and_keeps_the_good_checkpoints(tmp_path, monkeypatch):
    poison_steps(monkeypatch, {3})
    with pytest.raises(NonFiniteError, match=r"^step 3 has loss=nan and grad_norm=nan; .*NonFinitePolicy.action"):
        run(tmp_path, num_steps=6)
    assert saved_steps(tmp_path) == [2]
    assert all_finite(saved_checkpoint(tmp_path, 2)["state"])
    assert [r["step"] for r in records(tmp_path)] == [1, 2]  # the NaN step is not logged as progress


def test_the_skip_policy_leaves_nan_steps_out_counts_them_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    poison_steps(monkeypatch, {3, 4})
    result = run(tmp_path, num_steps=6, keep_checkpoints=2, nonfinite_policy=NonFinitePolicy(action="skip"))
    assert result.step == 6
    logged = {r["step"]: r["skipped_steps"] for r in records(tmp_path) if "loss" in r}
    assert logged == {1: 0, 2: 0, 3: 1, 4: 1, 5: 0, 6: 0}
    # keep_checkpoints=2 keeps steps 4 and 6; step 2, the newest before the first NaN, stays out of rotation
    assert saved_steps(tmp_path) == [2, 4, 6]
    assert Checkpointer(str(tmp_path / "checkpoints"), read_only=True).kept_steps == [2]
    good, skipped = saved_checkpoint(tmp_path, 2), saved_checkpoint(tmp_path, 4)
    assert_trees_equal(skipped["state"]["params"], good["state"]["params"])  # steps 3 and 4 changed nothing
    assert_trees_equal(skipped["state"]["opt_state"], good["state"]["opt_state"])
    assert skipped["data"] == {"batches_consumed": 4}  # the data moved on past the skipped batches
    assert all_finite(saved_checkpoint(tmp_path, 6)["state"])


def test_a_non_finite_state_from_finite_gradients_is_never_saved(tmp_path):
    def schedule(count):  # the optimizer's count of updates: NaN for the fourth, the update of step 4
        return jnp.where(count >= 3, jnp.nan, 1e-3)

    with pytest.raises(NonFiniteError, match=r"^the state after step 4 is not finite although .* learning rate"):
        run(tmp_path, num_steps=6, schedule=schedule)
    assert saved_steps(tmp_path) == [2]
    assert all_finite(saved_checkpoint(tmp_path, 2)["state"])


def step_metrics(finite: bool) -> dict:
    value = 1.0 if finite else float("nan")
    return {"finite": jnp.asarray(finite), "loss": jnp.asarray(value), "grad_norm": jnp.asarray(value)}


def test_the_skip_policy_stops_after_too_many_nan_steps_in_a_row():
    monitor = NonFiniteMonitor(NonFinitePolicy(action="skip", max_consecutive_skips=2))
    for step, finite in [(1, False), (2, True), (3, False)]:
        monitor.add(step, step_metrics(finite))
    monitor.check()
    assert monitor.skipped_since_last_call() == {"skipped_steps": 2.0} and monitor.first_skipped_step == 1
    monitor.add(4, step_metrics(False))
    with pytest.raises(NonFiniteError, match=r"^step 4 has loss=nan .*: 2 non-finite steps in a row were skipped"):
        monitor.check()


@pytest.mark.parametrize("policy,message", [
    ({"action": "ignore"}, "NonFinitePolicy.action='ignore' is unknown; use 'stop' or 'skip'"),
    ({"max_consecutive_skips": 0}, "NonFinitePolicy.max_consecutive_skips=0 must be a positive integer"),
])
def test_a_bad_policy_is_a_clear_error(policy, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        NonFinitePolicy(**policy)
