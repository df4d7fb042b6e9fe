"""The host input pipeline the trainer uses: seqio task -> packed batches -> numpy.

`get_dataset` is deterministic for a fixed seed (seeded shuffles, seeded
stateless preprocessors, tf.data's default deterministic ordering), so the
batch at position n is a pure function of (task, split, lengths, batch size,
seed, shard). `ResumableIterator` relies on that: its whole state is the
number of batches consumed, and resuming rebuilds the dataset and skips.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import seqio
import tensorflow as tf

ENCDEC_FEATURES = ("encoder_input_tokens", "decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights")
PACKING_FEATURES = ("encoder_segment_ids", "encoder_positions", "decoder_segment_ids", "decoder_positions")


def get_task_or_mixture(mixture_or_task_name: str) -> seqio.DatasetProviderBase:
    """The registered seqio task or mixture; an unknown name lists the registered ptmjax ones."""
    try:
        return seqio.get_mixture_or_task(mixture_or_task_name)
    except ValueError:
        known = sorted({*seqio.TaskRegistry.names(), *seqio.MixtureRegistry.names()})
        known = [name for name in known if name.startswith("ptmjax")] or known
        raise ValueError(
            f"unknown task or mixture {mixture_or_task_name!r}; registered ptmjax ones: {', '.join(known)}; "
            "ptmjax.configurables registers every built-in one (import the module that registers yours first)"
        ) from None


def task_vocabulary(mixture_or_task_name: str) -> seqio.Vocabulary:
    """The vocabulary of a task's 'targets', or of its 'inputs' for a task without targets (a head's)."""
    features = get_task_or_mixture(mixture_or_task_name).output_features
    return features["targets" if "targets" in features else "inputs"].vocabulary


def get_dataset(
    mixture_or_task_name: str,
    split: str,
    task_feature_lengths: Mapping[str, int],
    batch_size: int,
    *,
    seed: int,
    shuffle: bool,
    pack: bool = True,
    num_epochs: int | None = None,
    shard_index: int = 0,
    num_shards: int = 1,
    pad_final_batch: bool = False,
    feature_converter: type[seqio.FeatureConverter] = seqio.EncDecFeatureConverter,
) -> tf.data.Dataset:
    """Batches of model features from a registered task or mixture.

    Args:
      mixture_or_task_name: a registered seqio task or mixture.
      split: e.g. 'train' or 'validation'.
      task_feature_lengths: {'inputs': n, 'targets': m}.
      batch_size: examples per batch of this shard; the last partial batch is
        dropped, or padded when `pad_final_batch`.
      seed: seeds shuffling and the random preprocessors.
      shuffle: shuffle examples (use False for evaluation).
      pack: pack several examples per row (adds segment ids and positions).
      num_epochs: passes over the data; None repeats forever.
      shard_index: this host's shard.
      num_shards: number of hosts reading disjoint shards.
      pad_final_batch: fill the last partial batch with all-zero rows (zero loss
        weight) instead of dropping it, so that evaluation sees every example.
      feature_converter: the seqio converter class for the model family
        (encoder-decoder by default; seqio.DecoderFeatureConverter for GPT-2).

    Returns:
      A dataset of dicts of int32 [batch_size, length] tensors; for the
      encoder-decoder converter: encoder_input_tokens, decoder_target_tokens,
      decoder_input_tokens, decoder_loss_weights, and with `pack` also
      encoder/decoder_segment_ids and encoder/decoder_positions.
    """
    provider = get_task_or_mixture(mixture_or_task_name)
    if split not in provider.splits:
        raise ValueError(f"unknown split {split!r} of {mixture_or_task_name!r}; known: {', '.join(provider.splits)}")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be at least 1")
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index={shard_index} must lie in [0, num_shards={num_shards})")
    missing = set(feature_converter.TASK_FEATURES) - set(task_feature_lengths)
    if missing:
        raise ValueError(f"task_feature_lengths {dict(task_feature_lengths)} lacks {sorted(missing)}")
    with _uncached_source_advice_dropped():
        dataset = seqio.get_dataset(
            provider,
            task_feature_lengths=dict(task_feature_lengths),
            feature_converter=feature_converter(pack=pack),
            dataset_split=split,
            shuffle=shuffle,
            num_epochs=num_epochs,
            shard_info=seqio.ShardInfo(index=shard_index, num_shards=num_shards),
            seed=seed,
            verbose=False,
        )
    if pad_final_batch:
        dataset = dataset.batch(batch_size).map(lambda batch: _pad_rows(batch, batch_size))
    else:
        dataset = dataset.batch(batch_size, drop_remainder=True)
    dataset = dataset.map(lambda batch: {k: tf.cast(v, tf.int32) for k, v in batch.items()})
    return without_autotuning(dataset.prefetch(tf.data.AUTOTUNE))


def empty_split_error(feature_converter: type[seqio.FeatureConverter], split: str, task: str) -> ValueError:
    """The error of a `split` of `task` that gives no batch: the converter's account of why (its `explain_empty`,
    built from its gin bindings) where it has one, else that the split is empty."""
    if hasattr(feature_converter, "explain_empty"):
        return ValueError(feature_converter(pack=False).explain_empty(split, task))
    return ValueError(f"the {split} split of {task!r} is empty; add {split} data")


def without_autotuning(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` without tf.data's autotuning thread, for any iterator read over minutes.

    That thread optimises on a period that doubles up to 60 s, and deleting an iterator sometimes waits
    the period out (the wake-up is lost while the thread optimises): a run's training iterator held up
    the end of `ptmjax train` by up to a minute. Without it, AUTOTUNE parallelism stays at its starting
    value, the smaller of 16 and the number of cores, and the elements are the same (docs/performance_log.md).
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


UNCACHED_SOURCE_ADVICE = "Using an uncached FunctionDataset for training"


@contextlib.contextmanager
def _uncached_source_advice_dropped():
    """Drops seqio's warning that a shuffled FunctionDataSource repeats data on restarts: cache the task.

    It holds where a restart reshuffles from the start. Here a restart rebuilds the same seeded
    pipeline and skips the batches it has consumed (`ResumableIterator`), so it reads what an
    uninterrupted run reads next; the warning, printed for every task built, would only mislead.
    """
    absl_logger = logging.getLogger("absl")
    absl_logger.addFilter(_not_uncached_source_advice)
    try:
        yield
    finally:
        absl_logger.removeFilter(_not_uncached_source_advice)


def _not_uncached_source_advice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(UNCACHED_SOURCE_ADVICE)


def _pad_rows(batch: dict[str, tf.Tensor], batch_size: int) -> dict[str, tf.Tensor]:
    """Pads [n, ...] features to [batch_size, ...] with zero rows."""

    def pad(value: tf.Tensor) -> tf.Tensor:
        padded = tf.pad(value, [[0, batch_size - tf.shape(value)[0]]] + [[0, 0]] * (value.shape.rank - 1))
        return tf.ensure_shape(padded, [batch_size, *value.shape[1:]])

    return {name: pad(value) for name, value in batch.items()}


class ResumableIterator(Iterator[dict[str, np.ndarray]]):
    """Deterministic, resumable host iterator: position = batches consumed.

    `make_dataset` must build the same (deterministic) dataset on every call;
    resuming at n rebuilds it and skips n batches inside tf.data (the skipped
    batches are still computed, but never copied to Python).
    """

    def __init__(self, make_dataset: Callable[[], tf.data.Dataset], batches_consumed: int = 0):
        if batches_consumed < 0:
            raise ValueError(f"batches_consumed={batches_consumed} must be >= 0")
        self._batches_consumed = batches_consumed
        self._iterator = make_dataset().skip(batches_consumed).as_numpy_iterator()

    def __iter__(self) -> ResumableIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self._iterator)
        self._batches_consumed += 1
        return batch

    def state(self) -> dict[str, int]:
        """{'batches_consumed': n}: JSON-serialisable; pass n back to resume."""
        return {"batches_consumed": self._batches_consumed}
