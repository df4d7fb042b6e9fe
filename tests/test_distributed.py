"""initialize_distributed: argument checks, what reaches jax.distributed.initialize, and `ptmjax train --distributed`.

Nothing connects: jax.distributed.initialize is replaced by a recorder.
"""

from __future__ import annotations

import gin
import jax
import pytest

from ptmjax import cli
from ptmjax.training import multihost, run
from ptmjax.training.multihost import initialize_distributed


@pytest.fixture
def calls(monkeypatch) -> list[dict]:
    """The keyword arguments of each jax.distributed.initialize call; JAX reports "not yet initialised"."""
    recorded = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: recorded.append(kwargs))
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    return recorded


def test_no_arguments_leave_the_cluster_to_jax_auto_detection(calls):
    initialize_distributed()
    assert calls == [dict(coordinator_address=None, num_processes=None, process_id=None, local_device_ids=None)]


def test_explicit_cluster_is_passed_through(calls):
    initialize_distributed("10.0.0.1:1234", 4, 3, local_device_ids=(0, 1))
    assert calls == [dict(coordinator_address="10.0.0.1:1234", num_processes=4, process_id=3, local_device_ids=[0, 1])]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(coordinator_address="10.0.0.1:1234"), "but not num_processes, process_id; give all three"),
        (dict(num_processes=2, process_id=0), "but not coordinator_address"),
        (dict(coordinator_address="10.0.0.1", num_processes=2, process_id=0), "must be 'host:port'"),
        (dict(coordinator_address="host:99999", num_processes=2, process_id=0), "must be 'host:port'"),
        (dict(coordinator_address="host:1234", num_processes=0, process_id=0), "num_processes must be an int >= 1"),
        (dict(coordinator_address="host:1234", num_processes=2, process_id=2), r"\[0, num_processes=2\), got 2"),
        (dict(local_device_ids=[0, -1]), "local_device_ids must be non-negative"),
        (dict(local_device_ids=[]), "local_device_ids must be non-negative"),
    ],
)
def test_bad_arguments_are_refused_before_connecting(calls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        initialize_distributed(**kwargs)
    assert calls == []


def test_a_second_call_does_nothing(calls, monkeypatch):
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
    initialize_distributed("10.0.0.1:1234", 2, 0)
    assert calls == []


def test_train_distributed_initializes_from_gin_before_training(calls, monkeypatch, tmp_path):
    order = []
    monkeypatch.setattr(multihost, "initialize_distributed", lambda: order.append("initialize") or
                        initialize_distributed())

    def fake_train(model_dir, resume_step=None):
        order.append("train")
        return run.TrainResult(model_dir, 0, None, {}, False, {})

    monkeypatch.setattr(run, "train", fake_train)
    args = cli._parser().parse_args([
        "train", "--distributed", f"--model_dir={tmp_path}", "--gin_file=mesh/dp.gin",
        "--gin_bindings=initialize_distributed.coordinator_address = '10.0.0.1:1234'",
        "--gin_bindings=initialize_distributed.num_processes = 2",
        "--gin_bindings=initialize_distributed.process_id = 1",
    ])
    try:
        assert cli.run_train(args) == 0
    finally:
        gin.clear_config()
    assert order == ["initialize", "train"]
    assert calls == [dict(coordinator_address="10.0.0.1:1234", num_processes=2, process_id=1, local_device_ids=None)]
    assert not cli._parser().parse_args(["train"]).distributed  # single host: off by default
