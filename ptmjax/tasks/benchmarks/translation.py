"""WMT14 English-German translation as T5 casts it to text: a seqio task over TFDS 'wmt14_translate/de-en:1.0.0'.

Importing this module registers 'ptmjax_wmt14_ende' with `vocabularies.default_vocabulary()` (nothing is
read): inputs 'translate English to German: {en}', targets the German text (T5's `preprocessors.translate`,
as 'wmt14_ende_v003'); splits 'train', 'validation' (newstest2013), 'test' (newstest2014); metric 'bleu'
(`metrics.bleu`: sacrebleu corpus BLEU with T5's settings).
"""

from __future__ import annotations

import seqio
import tensorflow as tf

from ptmjax import metrics
from ptmjax.data import vocabularies
from ptmjax.tasks import text_to_text

TFDS_NAME = "wmt14_translate/de-en:1.0.0"
SPLITS = ("train", "validation", "test")
LANGUAGE_NAMES = {"en": "English", "de": "German"}


def translate_preprocessor(source_language: str, target_language: str):
    """T5's `preprocessors.translate`: 'translate {Source} to {Target}: {source text}' -> the target text."""
    prefix = f"translate {LANGUAGE_NAMES[source_language]} to {LANGUAGE_NAMES[target_language]}:"

    @seqio.map_over_dataset
    def preprocess(x: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return {"inputs": tf.strings.join([prefix, x[source_language]], separator=" "),
                "targets": x[target_language]}

    return preprocess


def register_translation_task(
    vocabulary: seqio.Vocabulary | None = None, prefix: str = text_to_text.DEFAULT_PREFIX
) -> seqio.Task:
    """(Re-)registers '{prefix}wmt14_ende' with `vocabulary` (default: `vocabularies.default_vocabulary()`)."""
    return text_to_text.register(
        f"{prefix}wmt14_ende", text_to_text.tfds_source(TFDS_NAME, SPLITS), translate_preprocessor("en", "de"),
        vocabulary or vocabularies.default_vocabulary(), (metrics.bleu,),
    )


register_translation_task()
