"""DevicePrefetcher: the same batches in the same order, exact data positions, errors raised, threads joined."""

import itertools
import json
import os
import threading

import jax
import numpy as np
import pytest

from ptmjax import partitioning
from ptmjax.data import pipeline
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.storage.checkpoints import Checkpointer
from ptmjax.tasks import pretraining
from ptmjax.training.prefetch import DevicePrefetcher
from ptmjax.training.run import train

LENGTHS = {"inputs": 32, "targets": 8}
CONFIG = T5Config(
    vocab_size=2176, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=1,
    num_decoder_layers=1, ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.1,
)


class Counting:
    """A positioned source of ints 0, 1, ... (up to `length`), failing at `fail_at`; counts what was read."""

    def __init__(self, length=None, fail_at=None, start=0):
        self.read, self.length, self.fail_at, self.start = 0, length, fail_at, start

    def __next__(self):
        index = self.start + self.read
        if index == self.fail_at:
            raise OSError(f"unreadable batch {index}")
        if self.length is not None and index >= self.length:
            raise StopIteration
        self.read += 1
        return index

    def state(self):
        return {"batches_consumed": self.start + self.read}


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "ptmjax-device-prefetch"]


@pytest.mark.parametrize("size", [0, 1, 3])
def test_same_items_in_order_and_the_position_counts_only_taken_batches(size):
    source = Counting(length=20, start=5)
    with DevicePrefetcher(source, lambda i: ("on device", i), size) as batches:
        first = list(itertools.islice(batches, 4))
        assert first == [("on device", i) for i in range(5, 9)]
        assert batches.state() == {"batches_consumed": 9}  # however far the thread read ahead
        assert source.read <= 4 + size + 1
        rest = list(batches)
    assert rest == [("on device", i) for i in range(9, 20)]
    assert batches.state() == {"batches_consumed": 20}
    assert list(batches) == []  # stays exhausted
    assert not prefetch_threads()


@pytest.mark.parametrize("size", [0, 2])
@pytest.mark.parametrize("where", ["source", "to_device"])
def test_an_error_comes_after_the_batches_before_it_and_ends_the_thread(size, where):
    def to_device(i):
        if where == "to_device" and i == 3:
            raise OSError("device full")
        return i

    source = Counting(fail_at=3 if where == "source" else None)
    batches = DevicePrefetcher(source, to_device, size)
    assert [next(batches) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(OSError, match="unreadable batch 3" if where == "source" else "device full"):
        next(batches)
    assert batches.state() == {"batches_consumed": 3}
    assert not prefetch_threads()
    batches.close()  # again: harmless


def test_close_stops_a_thread_blocked_on_a_full_queue():
    source = Counting()  # endless
    batches = DevicePrefetcher(source, lambda i: i, 2)
    assert next(batches) == 0
    threading.Event().wait(0.3)  # the thread fills the queue and waits for room
    batches.close()
    assert not prefetch_threads()
    assert source.read <= 1 + 2 + 1
    with pytest.raises(RuntimeError, match="closed"):
        next(batches)


@pytest.mark.parametrize("size", [-1, 1.5, True])
def test_bad_sizes(size):
    with pytest.raises(ValueError, match="must be an int >= 0"):
        DevicePrefetcher(Counting(), lambda i: i, size)


def test_the_pipelines_batches_on_the_mesh_are_unchanged_and_resume_where_taken():
    mesh = partitioning.make_mesh(partitioning.MeshConfig())

    def make_dataset():
        return pipeline.get_dataset(pretraining.STDLIB_TASK, "train", LENGTHS, 8, seed=3, shuffle=True)

    def to_device(batch):
        return partitioning.global_batch(batch, mesh)

    want = list(itertools.islice(make_dataset().as_numpy_iterator(), 6))
    with DevicePrefetcher(pipeline.ResumableIterator(make_dataset), to_device, 3) as batches:
        got = [next(batches) for _ in range(4)]
        position = batches.state()["batches_consumed"]
    assert position == 4
    with DevicePrefetcher(pipeline.ResumableIterator(make_dataset, position), to_device, 3) as batches:
        got += [next(batches) for _ in range(2)]
    for want_batch, got_batch in zip(want, got, strict=True):
        assert sorted(got_batch) == sorted(want_batch)
        for name, value in got_batch.items():
            assert value.sharding == partitioning.batch_sharding(mesh)
            np.testing.assert_array_equal(jax.device_get(value), want_batch[name])


def run(model_dir, num_steps, prefetch_batches):
    return train(
        str(model_dir), model=EncoderDecoder(CONFIG), task_feature_lengths=LENGTHS, batch_size=8,
        num_steps=num_steps, log_every=1, eval_every=3, eval_batches=1, checkpoint_every=3, show_progress=False,
        prefetch_batches=prefetch_batches,
    )


def losses(model_dir):
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


@pytest.mark.slow  # four training runs; the batches and their order are compared above, and the default
# suite's resume tests (test_loop.py) run with prefetching on
def test_training_with_and_without_prefetching_is_identical_and_resumes_exactly(tmp_path):
    plain, prefetched = tmp_path / "plain", tmp_path / "prefetched"
    run(plain, 5, prefetch_batches=0)
    run(prefetched, 3, prefetch_batches=4)  # stops with batches read ahead, which must not count
    result = run(prefetched, 5, prefetch_batches=4)
    assert result.step == 5
    want, got = losses(plain), losses(prefetched)
    assert sorted(got) == [1, 2, 3, 4, 5]
    assert got == want  # the same batches give bit-identical steps
    # Saved positions count the batches the steps took: 3 at the stop (4 more were read ahead), then 5.
    data = lambda folder, step: Checkpointer(str(folder / "checkpoints")).read_back(step)["data"]  # noqa: E731
    assert data(prefetched, 3) == data(plain, 3) == {"batches_consumed": 3}
    assert data(prefetched, 5) == data(plain, 5) == {"batches_consumed": 5}
    assert not prefetch_threads()


def test_bad_prefetch_batches_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="train.prefetch_batches=-1"):
        run(tmp_path / "run", 2, prefetch_batches=-1)
    assert not os.path.exists(tmp_path / "run")
