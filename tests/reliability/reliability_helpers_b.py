"""Tiny training runs and readers of what they keep on disk, for the run-directory reliability tests."""

import json
import os
from collections import Counter

from ptmjax.convert.checkpoint import model_gin
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.tasks import pretraining  # noqa: F401 - registers the built-in tasks
from ptmjax.training.run import train

CONFIG = T5Config(
    vocab_size=2176, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=1,
    num_decoder_layers=1, ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)


def run(model_dir, num_steps, config=CONFIG, **options):
    """A few steps of a tiny T5 on the embedded corpus: logs every step, evaluates and saves every 2."""
    settings = dict(log_every=1, eval_every=2, eval_batches=1, checkpoint_every=2, show_progress=False)
    return train(
        str(model_dir), model=EncoderDecoder(config), task_feature_lengths={"inputs": 32, "targets": 8},
        batch_size=8, num_steps=num_steps, **{**settings, **options},
    )


def bind_model(model_dir, config=CONFIG) -> None:
    """Adds the gin bindings of EncoderDecoder(config) to a run's config.gin (a run given its model in Python
    saves none), so that the readers of the folder build that model."""
    with open(os.path.join(model_dir, "config.gin"), "a") as f:
        f.write(model_gin(EncoderDecoder(config)))


def records(model_dir):
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def event_counts(run_dir):
    """{(tag, step): how many summaries of it} over every event file of one TensorBoard run."""
    import tensorflow as tf

    counts = Counter()
    for name in os.listdir(run_dir):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(run_dir, name)):
            counts.update((value.tag, event.step) for value in event.summary.value)
    return counts
