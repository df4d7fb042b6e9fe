"""A damaged newest checkpoint is set aside and the run resumes from the previous good one; the checkpointer
shuts down cleanly on every way out (no "Event loop is closed" from Orbax's threads, made an error here), and
the TensorStore reads a failed restore leaves in flight report nothing (ptmjax.storage.checkpoints drops them)."""

import dataclasses
import glob
import os

import jax
import pytest
from reliability_helpers_a import CONFIG, records, run, saved_steps, train_losses

from ptmjax import partitioning
from ptmjax.models import EncoderDecoder
from ptmjax.storage.checkpoints import Checkpointer
from ptmjax.storage.damaged_checkpoints import restore_newest_intact
from ptmjax.training.optimizers import adafactor
from ptmjax.training.schedules import rsqrt_with_warmup
from ptmjax.training.trainer import Trainer

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")


def delete_metadata(checkpoint_dir) -> None:
    os.remove(os.path.join(checkpoint_dir, "state", "_METADATA"))


def truncate_array_files(checkpoint_dir) -> None:
    for path in glob.glob(os.path.join(checkpoint_dir, "state", "ocdbt.process_0", "d", "*")):
        os.truncate(path, min(os.path.getsize(path), 100))


@pytest.mark.slow
def test_damaged_newest_checkpoints_are_set_aside_and_the_run_resumes_from_the_last_good_one(tmp_path, capsys):
    run(tmp_path, num_steps=6)
    want = train_losses(tmp_path)
    checkpoints = tmp_path / "checkpoints"
    delete_metadata(checkpoints / "6")
    truncate_array_files(checkpoints / "4")
    capsys.readouterr()

    result = run(tmp_path, num_steps=6)

    out = capsys.readouterr().out
    assert (
        f"checkpoint step 6 is damaged (FileNotFoundError: Metadata file (named _METADATA) does not exist at "
        f"{checkpoints}/6/state.); moved it to {checkpoints}/6.damaged for inspection and resuming from step 4" in out
    )
    assert "checkpoint step 4 is damaged (ValueError: OUT_OF_RANGE: Error reading " in out
    assert f"moved it to {checkpoints}/4.damaged for inspection and resuming from step 2" in out
    assert f"Resumed from step 2 in {checkpoints}" in out
    assert result.step == 6 and saved_steps(tmp_path) == [2, 4, 6]
    assert "_METADATA" not in os.listdir(checkpoints / "6.damaged" / "state")  # kept as it was found
    assert train_losses(tmp_path) == want  # steps 3 to 6 replayed bitwise
    assert [r["step"] for r in records(tmp_path) if "loss" in r] == [1, 2, 3, 4, 5, 6]


def make_trainer(d_model: int) -> Trainer:
    schedule, mesh_config = rsqrt_with_warmup(), partitioning.MeshConfig()
    model = EncoderDecoder(dataclasses.replace(CONFIG, d_model=d_model))
    return Trainer(model, adafactor(schedule), schedule, partitioning.make_mesh(mesh_config), mesh_config.rules)


@pytest.fixture(scope="module")
def trainer() -> Trainer:
    return make_trainer(CONFIG.d_model)


def save_one(directory, trainer: Trainer) -> Checkpointer:
    checkpointer = Checkpointer(str(directory))
    checkpointer.save(1, trainer.init_state(jax.random.key(0)), {"batches_consumed": 1})
    checkpointer.wait()
    return checkpointer


def test_an_intact_checkpoint_of_another_model_is_left_in_place(tmp_path, trainer):
    checkpointer = save_one(tmp_path, trainer)
    wider = make_trainer(2 * CONFIG.d_model)
    with pytest.raises(ValueError, match="is not compatible with the stored shape"):
        restore_newest_intact(checkpointer, wider.abstract_state, wider.state_shardings)
    assert sorted(os.listdir(tmp_path)) == ["1"]
    checkpointer.close()


def test_a_damaged_only_checkpoint_is_a_clear_error(tmp_path, trainer):
    checkpointer = save_one(tmp_path, trainer)
    delete_metadata(tmp_path / "1")
    with pytest.raises(FileNotFoundError) as raised:
        restore_newest_intact(checkpointer, trainer.abstract_state, trainer.state_shardings)
    assert str(raised.value) == (
        f"checkpoint step 1, the last one in {tmp_path}, is damaged (FileNotFoundError: Metadata file (named "
        f"_METADATA) does not exist at {tmp_path}/1/state.); it was moved to {tmp_path}/1.damaged for inspection; "
        "rerun to start the run over"
    )
    assert sorted(os.listdir(tmp_path)) == ["1.damaged"]
    checkpointer.close()
