"""Abstractive summarization as T5 casts it to text: seqio tasks over TFDS CNN/DailyMail and XSum.

Importing this module registers, with `vocabularies.default_vocabulary()` (nothing is read):

* 'ptmjax_cnn_dailymail': TFDS 'cnn_dailymail:3.4.0' (T5's latest), inputs 'summarize: {article}',
  targets the highlights (one per line).
* 'ptmjax_xsum': TFDS 'xsum:1.1.0', inputs 'summarize: {document}', targets the one-sentence summary.

Both as T5's `preprocessors.summarize`, splits 'train', 'validation', 'test', metrics 'rouge1', 'rouge2',
'rougeLsum' (`metrics.rouge`: F-measure, 0-100, with stemming).
"""

from __future__ import annotations

import seqio
import tensorflow as tf

from ptmjax import metrics
from ptmjax.data import vocabularies
from ptmjax.tasks import text_to_text

SPLITS = ("train", "validation", "test")
# task suffix: (TFDS name, article feature, summary feature)
DATASETS = {
    "cnn_dailymail": ("cnn_dailymail:3.4.0", "article", "highlights"),
    "xsum": ("xsum:1.1.0", "document", "summary"),
}


def summarize_preprocessor(article_key: str, summary_key: str):
    """T5's `preprocessors.summarize`: 'summarize: {article}' -> the summary."""

    @seqio.map_over_dataset
    def preprocess(x: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return {"inputs": tf.strings.join(["summarize:", x[article_key]], separator=" "), "targets": x[summary_key]}

    return preprocess


def register_summarization_tasks(
    vocabulary: seqio.Vocabulary | None = None, prefix: str = text_to_text.DEFAULT_PREFIX
) -> tuple[seqio.Task, ...]:
    """(Re-)registers '{prefix}cnn_dailymail' and '{prefix}xsum' with `vocabulary` (default:
    `vocabularies.default_vocabulary()`)."""
    vocabulary = vocabulary or vocabularies.default_vocabulary()
    return tuple(
        text_to_text.register(f"{prefix}{suffix}", text_to_text.tfds_source(tfds_name, SPLITS),
                             summarize_preprocessor(article_key, summary_key), vocabulary, (metrics.rouge,))
        for suffix, (tfds_name, article_key, summary_key) in DATASETS.items()
    )


register_summarization_tasks()
