"""A NaN loss stops the run (or is skipped), and no non-finite state reaches a checkpoint."""

import json
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


@pytest.mark.slow
def test_a_nan_loss_stops_the_run_naming_the_step_and_keeps_the_good_checkpoints(tmp_path, monkeypatch):
    poison_steps(monkeypatch, {3})
    with pytest.raises(NonFiniteError, match=r"^step 3 has loss=nan and grad_norm=nan; .*NonFinitePolicy.action"):
        run(tmp_path, num_steps=6)
    assert saved_steps(tmp_path) == [2]
    assert all_finite(saved_checkpoint(tmp_path, 2)["state"])
    assert [r["step"] for r in records(tmp_path)] == [1, 2]  # the NaN step is not logged as progress


@pytest.mark.slow
def test_the_skip_policy_leaves_nan_steps_out_counts_them_and_saves_no_checkpoint_during_a_streak(
    tmp_path, monkeypatch, capsys
):
    poison_steps(monkeypatch, {3, 4})
    result = run(tmp_path, num_steps=8, keep_checkpoints=1, nonfinite_policy=NonFinitePolicy(action="skip"))
    assert result.step == 8
    logged = {r["step"]: r["skipped_steps"] for r in records(tmp_path) if "loss" in r}
    assert logged == {1: 0, 2: 0, 3: 1, 4: 1, 5: 0, 6: 0, 7: 0, 8: 0}
    assert [r["loss"] for r in records(tmp_path) if r["step"] in (3, 4) and "loss" in r] == [None, None]
    assert "step 4: no checkpoint saved: steps 3-4 were skipped (not finite); the last good checkpoint is step 2" \
        in capsys.readouterr().out
    # step 4 ends a streak: not saved; keep_checkpoints=1 keeps step 8, and step 2, the newest checkpoint
    # before the first NaN, stays out of rotation
    assert saved_steps(tmp_path) == [2, 8]
    assert Checkpointer(str(tmp_path / "checkpoints"), read_only=True).kept_steps == [2]
    assert all_finite(saved_checkpoint(tmp_path, 8)["state"])
    assert saved_checkpoint(tmp_path, 8)["data"] == {"batches_consumed": 8}  # the data moved past the skipped


@pytest.mark.slow
def test_metrics_jsonl_stays_strict_json_with_non_finite_values(tmp_path, monkeypatch):
    poison_steps(monkeypatch, {2})
    run(tmp_path, num_steps=3, nonfinite_policy=NonFinitePolicy(action="skip"))

    def refuse(constant):
        raise AssertionError(f"metrics.jsonl holds the non-JSON token {constant}")

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    parsed = [json.loads(line, parse_constant=refuse) for line in lines]
    assert parsed[1]["step"] == 2 and parsed[1]["loss"] is None and parsed[1]["grad_norm"] is None


@pytest.mark.slow
def test_a_streak_stop_names_the_last_good_checkpoint_and_how_to_resume_from_it(tmp_path, monkeypatch):
    poison_steps(monkeypatch, {5, 6, 7})
    policy = NonFinitePolicy(action="skip", max_consecutive_skips=3)
    with pytest.raises(NonFiniteError) as raised:
        run(tmp_path, num_steps=10, nonfinite_policy=policy)
    assert str(raised.value).startswith("step 7 has loss=nan and grad_norm=nan: ")
    assert (
        "3 non-finite steps in a row were skipped, NonFinitePolicy.max_consecutive_skips=3; stopped. The last "
        "good checkpoint is step 4, saved before step 5, the first of them: lower the learning rate and resume "
        "from it with `ptmjax train ... --resume_step=4` (in Python: train(..., resume_step=4)), which sets the "
        "newer checkpoints aside"
    ) in str(raised.value)
    assert saved_steps(tmp_path) == [2, 4]  # step 6, in the streak, was not saved


@pytest.mark.slow
def test_resume_step_resumes_an_older_checkpoint_bitwise_and_sets_the_newer_aside(tmp_path):
    reference = tmp_path / "reference"
    run(reference, num_steps=6, keep_checkpoints=3)
    resumed = tmp_path / "resumed"
    run(resumed, num_steps=6, keep_checkpoints=3)
    final = saved_checkpoint(resumed, 6)
    assert run(resumed, num_steps=6, keep_checkpoints=3, resume_step=2).step == 6
    assert saved_steps(resumed) == [2, 4, 6]
    assert sorted(p.name for p in (resumed / "checkpoints").iterdir() if "abandoned" in p.name) == \
        ["4.abandoned", "6.abandoned"]
    assert_trees_equal(saved_checkpoint(resumed, 6)["state"], final["state"])
    assert_trees_equal(saved_checkpoint(resumed, 6)["state"], saved_checkpoint(reference, 6)["state"])
    steps = [r["step"] for r in records(resumed) if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]  # the records of steps 3-6 were dropped before they were replayed


@pytest.mark.slow
def test_resume_step_must_be_a_saved_step(tmp_path):
    run(tmp_path, num_steps=4)
    config = (tmp_path / "config.gin").read_text()
    with pytest.raises(FileNotFoundError, match=r"^--resume_step=3: no checkpoint for step 3 under .*saved "
                                                 r"steps: \[2, 4\]\n"):
        run(tmp_path, num_steps=6, resume_step=3)
    assert saved_steps(tmp_path) == [2, 4] and (tmp_path / "config.gin").read_text() == config


@pytest.mark.slow
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
