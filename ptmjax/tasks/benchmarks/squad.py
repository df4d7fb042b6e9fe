"""SQuAD v1.1 as T5 casts it to text: a seqio task over TFDS 'squad/v1.1:3.0.0'.

Importing this module registers 'ptmjax_squad' with `vocabularies.default_vocabulary()` (nothing is read):
inputs 'question: {question} context: {context}', targets the first gold answer, punctuation padded with
spaces in all three (T5's `preprocessors.squad`). For evaluation the postprocessor hands the metric every
gold answer of an example (T5's `postprocessors.qa`); `metrics.squad` reports 'em' and 'f1' (0-100), each
the best over those answers, as T5's 'squad_v010_allanswers'. Splits: 'train', 'validation'.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import seqio
import tensorflow as tf

from ptmjax import metrics
from ptmjax.data import vocabularies
from ptmjax.tasks import text_to_text

TFDS_NAME = "squad/v1.1:3.0.0"
SPLITS = ("train", "validation")


@seqio.map_over_dataset
def squad_preprocessor(x: dict[str, Any]) -> dict[str, tf.Tensor]:
    """'question: {q} context: {c}' -> the first answer; keeps every (padded) answer as 'answers'."""
    answers = text_to_text.pad_punctuation(x["answers"]["text"])
    inputs = text_to_text.join(["question:", text_to_text.pad_punctuation(x["question"]), "context:",
                          text_to_text.pad_punctuation(x["context"])])
    return {"inputs": inputs, "targets": answers[0], "answers": answers, "id": x["id"]}


def qa_postprocessor(text: str, example: Mapping[str, Any] | None = None, is_target: bool = False) -> str | list[str]:
    """A prediction as it is; a target as the list of every gold answer of its example."""
    if is_target:
        return [text_to_text.as_text(answer) for answer in example["answers"]]
    return text


def register_squad_task(
    vocabulary: seqio.Vocabulary | None = None, prefix: str = text_to_text.DEFAULT_PREFIX
) -> seqio.Task:
    """(Re-)registers '{prefix}squad' with `vocabulary` (default: `vocabularies.default_vocabulary()`)."""
    return text_to_text.register(
        f"{prefix}squad", text_to_text.tfds_source(TFDS_NAME, SPLITS), squad_preprocessor,
        vocabulary or vocabularies.default_vocabulary(), (metrics.squad,), qa_postprocessor,
    )


register_squad_task()
