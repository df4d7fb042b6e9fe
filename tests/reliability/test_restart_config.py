"""Restarting a run with another model fails before anything is written, naming what differs."""

import dataclasses
import os

import pytest
from reliability_helpers_b import CONFIG, run


def test_a_wider_model_on_a_finished_run_keeps_its_config_and_names_the_differences(tmp_path):
    run(tmp_path, num_steps=2, eval_every=100)
    kept = {name: (tmp_path / name).read_bytes() for name in ("config.gin", "metrics.jsonl")}
    steps = sorted(os.listdir(tmp_path / "checkpoints"))

    wider = dataclasses.replace(CONFIG, d_model=48)
    with pytest.raises(ValueError) as error:
        run(tmp_path, num_steps=4, config=wider)

    message = str(error.value).splitlines()[0]  # gin adds a line naming the configurable; the CLI drops it
    assert message.startswith(f"{tmp_path / 'checkpoints'} (step 2) holds another model or optimizer")
    assert "params/decoder/decoder_norm/scale is (32,) there, (48,) here" in message
    assert "more. Nothing was written: train this config in a new --model_dir" in message
    assert message.endswith(f"resume this run with its own config ({tmp_path / 'config.gin'})")
    assert "strict" not in message
    assert {name: (tmp_path / name).read_bytes() for name in kept} == kept
    assert sorted(os.listdir(tmp_path / "checkpoints")) == steps
