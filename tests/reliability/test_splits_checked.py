"""Every split a run reads is checked before the first step, and a step's checkpoint is saved before it is
evaluated."""

import os

import gin
import pytest
from reliability_helpers_b import records, run

from ptmjax.storage.model_dir import ModelDir
from ptmjax.tasks import pretraining, registry
from ptmjax.training import run_spec
from ptmjax.training.trainer import Trainer

LINES = "\n".join(f"Line {i} of a small local corpus about packing, sharding and checkpoints." for i in range(200))


def text_task(tmp_path, name, validation_text=None):
    (tmp_path / "train.txt").write_text(LINES)
    validation = None
    if validation_text is not None:
        validation = str(tmp_path / "valid.txt")
        (tmp_path / "valid.txt").write_text(validation_text)
    return pretraining.register_text_files_task(name, str(tmp_path / "train.txt"), validation)


@pytest.mark.parametrize(
    ("validation_text", "message"),
    [
        (
            None,
            "'reliability_b_{name}' has no 'validation' split, which the run evaluates on every train.eval_every "
            "steps and at the end; register it with one (e.g. register_text_files_task.validation_pattern); "
            "its splits: train",
        ),
        (
            "",
            "the 'validation' files hold no text (empty or blank): {valid}; point the 'validation' pattern at UTF-8 "
            "text files, one document per line",  # a text-files task's own check (data/text_files.py) comes first
        ),
    ],
    ids=["missing", "empty"],
)
def test_a_missing_or_empty_validation_split_fails_before_any_step(tmp_path, validation_text, message):
    name = f"reliability_b_{'missing' if validation_text is None else 'empty'}"
    task = text_task(tmp_path, name, validation_text)
    model_dir = tmp_path / "run"
    with pytest.raises(ValueError) as error:
        run(model_dir, num_steps=20, mixture_or_task_name=task, eval_every=20)
    expected = message.format(name=name.removeprefix("reliability_b_"), valid=tmp_path / "valid.txt")
    assert str(error.value).splitlines()[0] == expected
    assert not model_dir.exists()  # no config, no checkpoint, no metrics: nothing to clean up


@pytest.mark.parametrize("as_mixture", [False, True], ids=["task", "mixture"])
def test_a_validation_source_that_yields_nothing_fails_before_any_step(tmp_path, as_mixture):
    """Checked on the source's raw examples: a task (or every task of a mixture) whose split is empty."""
    import seqio
    import tensorflow as tf

    def documents(split, shuffle_files=False):
        return tf.data.Dataset.from_tensor_slices({"text": LINES.splitlines() if split == "train" else [""]}).filter(
            lambda example: tf.strings.length(example["text"]) > 0
        )

    name = "reliability_b_empty_source"
    source = seqio.FunctionDataSource(documents, splits=("train", "validation"))
    vocabulary = pretraining.vocabularies.default_vocabulary()
    task = registry.register_task(name, source, pretraining.span_corruption_preprocessors(), vocabulary)
    if as_mixture:
        seqio.MixtureRegistry.remove(f"{name}_mixture")
        task = seqio.MixtureRegistry.add(f"{name}_mixture", [(task.name, 1.0)])
    model_dir = tmp_path / "run"
    with pytest.raises(ValueError) as error:
        run(model_dir, num_steps=20, mixture_or_task_name=task, eval_every=20)
    assert str(error.value).splitlines()[0] == (
        f"the 'validation' split of {task.name!r} yields no examples, and the run evaluates on every "
        "train.eval_every steps and at the end; add data to it (are its files empty?)"
    )
    assert not model_dir.exists()


@pytest.mark.slow
def test_a_failed_evaluation_keeps_the_checkpoint_of_its_step(tmp_path, monkeypatch):
    class EvaluationFails(Trainer):
        def eval_stats(self, *args):
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory while evaluating")

    monkeypatch.setattr(run_spec, "Trainer", EvaluationFails)
    gin.bind_parameter("Checkpointer.asynchronous", False)  # the save is on disk when train() returns or raises
    try:
        with pytest.raises(RuntimeError, match="out of memory while evaluating"):
            run(tmp_path, num_steps=2)
    finally:
        gin.clear_config()
    assert ModelDir(str(tmp_path)).saved_steps() == [2]
    assert [r["step"] for r in records(tmp_path)] == [1, 2]  # the train records of both steps
    assert os.path.isfile(tmp_path / "config.gin")


def test_a_validation_file_that_tokenises_to_nothing_fails_before_any_step(tmp_path):
    """Not blank (zero-width spaces are not whitespace), so the raw check passes; SentencePiece drops them all."""
    task = text_task(tmp_path, "reliability_b_zero_width", "\u200b\u200b\n\ufeff\n")
    model_dir = tmp_path / "run"
    with pytest.raises(ValueError) as error:
        run(model_dir, num_steps=20, mixture_or_task_name=task, eval_every=20)
    assert str(error.value).splitlines()[0] == (
        "the 'validation' split of 'reliability_b_zero_width' yields no examples once tokenised and preprocessed "
        "(its text is all characters the vocabulary drops, such as zero-width spaces, or too short for the "
        "objective), and the run evaluates on every train.eval_every steps and at the end; add text to it"
    )
    assert not model_dir.exists()


def test_zero_eval_batches_is_named_before_anything_is_built(tmp_path):
    """Not 'the validation split is empty', which is what an evaluation of 0 batches used to report."""
    with pytest.raises(ValueError, match=r"^train.eval_batches=0: must be a positive integer \(eval_batches may be "):
        run(tmp_path / "run", num_steps=2, eval_batches=0)
    assert not (tmp_path / "run").exists()


def test_text_the_vocabulary_lacks_is_a_warning_naming_the_share_of_unknown_ids(tmp_path):
    """A whitespace-free CJK line under the English SentencePiece model: all unknown ids, which trains on nothing."""
    from ptmjax.training.split_check import check_run_splits

    (tmp_path / "cjk.txt").write_text("\n".join(["日本語のテキストです。これは長い行です。" * 50] * 20))
    (tmp_path / "valid.txt").write_text(LINES)
    task = pretraining.register_text_files_task("reliability_b_cjk", str(tmp_path / "cjk.txt"),
                                                str(tmp_path / "valid.txt"))
    with pytest.warns(UserWarning, match=r"^\d+% of the ids of the first \d+ 'train' examples of "
                                         r"'reliability_b_cjk' are its vocabulary's unknown id: the text is mostly "
                                         r"characters the vocabulary lacks") as warned:
        check_run_splits(task.name, {"inputs": 32, "targets": 8})
    assert len(warned) == 1  # the English validation text: no warning


def test_zero_checkpoints_to_keep_is_named_as_the_train_binding(tmp_path):
    """Not Orbax's 'max_to_keep must be >= 1'."""
    with pytest.raises(ValueError, match=r"^train.keep_checkpoints=0: must be a positive integer"):
        run(tmp_path / "run", num_steps=2, keep_checkpoints=0)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_validation_check_reads_the_whole_split_not_this_hosts_shard(tmp_path):
    """A host whose validation shard is empty still runs: evaluation pads it (multihost.batches_in_lockstep)."""
    from ptmjax.data import pipeline
    from ptmjax.training.split_check import check_run_splits

    task = text_task(tmp_path, "reliability_b_one_validation_line", "The only validation line of this corpus.")
    lengths = {"inputs": 32, "targets": 8}

    def second_hosts_shard():
        return pipeline.get_dataset(task.name, "validation", lengths, 4, seed=0, shuffle=False, num_epochs=1,
                                    shard_index=1, num_shards=2, pad_final_batch=True)

    check_run_splits(task.name, lengths)  # passes: the split has an example
    assert list(second_hosts_shard().as_numpy_iterator()) == []  # though not in that host's shard
