"""Two tiny validation-only test tasks over the stdlib vocabulary, a mixture of both, and hand-built model rows.

PREDICT_TASK has ROUGE and a metric that records the predictions it gets;
SCORE_TASK a score metric that records the scores. `register()` adds them,
`remove()` takes them out of seqio's registries again.
"""

from __future__ import annotations

import numpy as np
import seqio
import tensorflow as tf

from ptmjax import metrics
from ptmjax.data import vocabularies
from ptmjax.tasks import text_to_text

PREDICT_TASK = "ptmjax_test_eval_predict"
SCORE_TASK = "ptmjax_test_eval_score"
MIXTURE = "ptmjax_test_eval_mixture"
LENGTHS = {"inputs": 24, "targets": 8}
EXAMPLES = (
    ("summarize: Return the sum of a list of numbers.", "Sum numbers."),
    ("summarize: Open a file and read every line of it.", "Read lines."),
    ("summarize: Sort the items by their key.", "Sort items."),
    ("summarize: Parse a date from a string.", "Parse a date."),
    ("summarize: Join paths with the separator of the system.", "Join paths."),
    ("summarize: Start a thread that runs the target.", "Start a thread."),
    ("summarize: Encode the text as bytes in UTF-8.", "Encode text."),
    ("summarize: Close the socket and free its resources.", "Close the socket."),
    ("summarize: Raise an error when the value is negative.", "Check the value."),
    ("summarize: Copy the tree of a folder to another.", "Copy a tree."),
)
RECORDED: dict[str, list] = {}


def record_predictions(targets: list[str], predictions: list[str]) -> dict[str, float]:
    RECORDED["predictions"] = list(predictions)
    return {"num_predictions": float(len(predictions))}


def record_scores(targets: list[str], scores: list[float]) -> dict[str, float]:
    RECORDED["scores"] = list(scores)
    return {"mean_log_likelihood": float(np.mean(scores))}


def _dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(
        {"inputs": [i for i, _ in EXAMPLES], "targets": [t for _, t in EXAMPLES]}
    )


def register() -> None:
    source = seqio.FunctionDataSource(_dataset_fn, splits=("validation",))
    vocabulary = vocabularies.stdlib_sentencepiece_vocabulary()
    text_to_text.register(PREDICT_TASK, source, None, vocabulary, (metrics.rouge, record_predictions))
    text_to_text.register(SCORE_TASK, source, None, vocabulary, (record_scores,))
    seqio.MixtureRegistry.remove(MIXTURE)
    seqio.MixtureRegistry.add(MIXTURE, [PREDICT_TASK, SCORE_TASK], default_rate=1.0)


def remove() -> None:
    seqio.MixtureRegistry.remove(MIXTURE)
    seqio.TaskRegistry.remove(PREDICT_TASK)
    seqio.TaskRegistry.remove(SCORE_TASK)


def _tokens(text: str, length: int) -> list[int]:
    vocabulary = vocabularies.stdlib_sentencepiece_vocabulary()
    ids = [*vocabulary.encode(text), vocabulary.eos_id]
    assert len(ids) <= length, f"{text!r} needs {len(ids)} > {length} tokens; shorten it"
    return ids


def _padded(rows: list[list[int]], length: int) -> np.ndarray:
    return np.array([row + [0] * (length - len(row)) for row in rows], np.int32)


def _shifted_right(rows: np.ndarray) -> np.ndarray:
    """T5's decoder inputs: each padded row shifted one slot right behind a 0."""
    return np.pad(rows, ((0, 0), (1, 0)))[:, :-1]


def encoder_decoder_rows() -> dict[str, np.ndarray]:
    """EXAMPLES as an encoder-decoder reads them: inputs in the encoder, targets shifted right in the decoder."""
    inputs = [_tokens(i, LENGTHS["inputs"]) for i, _ in EXAMPLES]
    targets = [_tokens(t, LENGTHS["targets"]) for _, t in EXAMPLES]
    return {
        "encoder_input_tokens": _padded(inputs, LENGTHS["inputs"]),
        "decoder_target_tokens": _padded(targets, LENGTHS["targets"]),
        "decoder_input_tokens": _shifted_right(_padded(targets, LENGTHS["targets"])),
        "decoder_loss_weights": _padded([[1] * len(t) for t in targets], LENGTHS["targets"]),
    }


def prefix_lm_rows() -> dict[str, np.ndarray]:
    """EXAMPLES as a prefix LM reads them: inputs then targets in one row, the inputs (and the start 0) seen
    bidirectionally, the loss on the targets only."""
    width = LENGTHS["inputs"] + LENGTHS["targets"]
    inputs = [_tokens(i, LENGTHS["inputs"]) for i, _ in EXAMPLES]
    targets = [_tokens(t, LENGTHS["targets"]) for _, t in EXAMPLES]
    pairs = list(zip(inputs, targets, strict=True))
    rows = [i + t for i, t in pairs]
    return {
        "decoder_target_tokens": _padded(rows, width),
        "decoder_input_tokens": _shifted_right(_padded(rows, width)),
        "decoder_causal_attention": _padded([[1] * (len(i) + 1) for i in inputs], width),
        "decoder_loss_weights": _padded([[0] * len(i) + [1] * len(t) for i, t in pairs], width),
    }
