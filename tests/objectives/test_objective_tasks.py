"""Every objective runs as a preprocessor of a seqio Task (temporary, removed after)."""

import functools

import numpy as np
import pytest
import seqio
import tensorflow as tf

from ptmjax.data import vocabularies
from ptmjax.objectives import bart_noising, language_modeling, masked_lm, mass

TEXTS = [
    "The quick brown fox jumps over the lazy dog. It was not amused! Was it?",
    "Return a new list containing all items from the iterable in ascending order.",
    "Open file and return a stream. Raise OSError upon failure.",
] * 10


def _source(split: str, shuffle_files: bool = False, seed: int | None = None) -> tf.data.Dataset:
    del split, shuffle_files, seed
    return tf.data.Dataset.from_tensor_slices({"text": TEXTS})


# (objective, sequence lengths, whether to append EOS after it, output keys)
CASES = {
    "causal_lm": (language_modeling.causal_lm, {"targets": 32}, True, {"targets"}),
    "prefix_lm": (language_modeling.prefix_lm, {"inputs": 32, "targets": 32}, True, {"inputs", "targets"}),
    "bert_mlm": (masked_lm.bert_mlm, {"inputs": 32, "targets": 32}, False, {"inputs", "targets", "loss_mask"}),
    "whole_word_mlm": (
        functools.partial(masked_lm.bert_mlm, options=masked_lm.MaskedLMOptions(masking="whole_word")),
        {"inputs": 32, "targets": 32},
        False,
        {"inputs", "targets", "loss_mask"},
    ),
    "span_mlm": (
        functools.partial(masked_lm.bert_mlm, options=masked_lm.MaskedLMOptions(masking="span")),
        {"inputs": 32, "targets": 32},
        False,
        {"inputs", "targets", "loss_mask"},
    ),
    "bart": (
        functools.partial(
            bart_noising.bart_noising, options=bart_noising.BartNoiseOptions(rotate_probability=0.5, mask_ratio=0.1)
        ),
        {"inputs": 32, "targets": 32},
        True,
        {"inputs", "targets"},
    ),
    "mass": (mass.mass, {"inputs": 32, "targets": 17}, True, {"inputs", "targets"}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_objective_in_a_seqio_task(name):
    objective, lengths, append_eos, keys = CASES[name]
    vocabulary = vocabularies.stdlib_sentencepiece_vocabulary()
    task_name = f"ptmjax_test_objective_{name}"
    preprocessors = [
        functools.partial(seqio.preprocessors.rekey, key_map={"targets": "text"}),
        seqio.preprocessors.tokenize,
        seqio.CacheDatasetPlaceholder(),
        objective,
    ] + ([seqio.preprocessors.append_eos_after_trim] if append_eos else [])
    seqio.TaskRegistry.remove(task_name)
    task = seqio.TaskRegistry.add(
        task_name,
        source=seqio.FunctionDataSource(_source, splits=["train"]),
        preprocessors=preprocessors,
        output_features={
            "inputs": seqio.Feature(vocabulary, add_eos=True, required=False),
            "targets": seqio.Feature(vocabulary, add_eos=True),
        },
    )
    try:
        out = list(task.get_dataset(lengths, split="train", shuffle=False, seed=0).as_numpy_iterator())
    finally:
        seqio.TaskRegistry.remove(task_name)
    assert len(out) > 3
    for x in out:
        assert set(x) == keys
        for key in keys:
            limit = lengths.get(key, lengths.get("inputs"))
            assert x[key].dtype == np.int32 and 1 <= len(x[key]) <= limit, (key, len(x[key]))
        assert x["targets"][-1] == 1  # EOS
