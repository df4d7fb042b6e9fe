"""GLUE as T5 casts it to text: seqio tasks over TFDS 'glue/<config>:2.0.0', and their mixture.

Importing this module registers, with `vocabularies.default_vocabulary()` (nothing is read):

| task ('ptmjax_' + ) | inputs | targets | metrics |
|---|---|---|---|
| glue_cola | 'cola sentence: {sentence}' | unacceptable / acceptable | matthews_corrcoef |
| glue_sst2 | 'sst2 sentence: {sentence}' | negative / positive | accuracy |
| glue_mrpc | 'mrpc sentence1: {s1} sentence2: {s2}' | not_equivalent / equivalent | f1, accuracy |
| glue_qqp | 'qqp question1: {q1} question2: {q2}' | not_duplicate / duplicate | f1, accuracy |
| glue_stsb | 'stsb sentence1: {s1} sentence2: {s2}' | score to 0.2: '3.8' | pearson_corrcoef, spearman_corrcoef |
| glue_mnli | 'mnli hypothesis: {h} premise: {p}' | entailment / neutral / contradiction | accuracy |
| glue_qnli | 'qnli question: {q} sentence: {s}' | entailment / not_entailment | accuracy |
| glue_rte | 'rte sentence1: {s1} sentence2: {s2}' | entailment / not_entailment | accuracy |
| glue_wnli | 'wnli sentence1: {s1} sentence2: {s2}' | not_entailment / entailment | accuracy |

As T5's `preprocessors.glue`: the benchmark name, then each feature as 'key: value' in sorted key order;
targets are TFDS' label names, '<unk>' for unlabelled test examples. Splits: 'train', 'validation',
'test'; MNLI has 'validation_matched', 'validation_mismatched', 'test_matched', 'test_mismatched', and
'ptmjax_glue_mnli_matched' / '_mismatched' serve one of them as 'validation' (and 'test').
Postprocessing turns the generated label into its class id (-1 if it is no label: always wrong), or
STS-B's text into a float (-1.0 if it is not a number); metrics are those of T5 (`metrics`).

'ptmjax_glue' mixes the nine training tasks in proportion to their TFDS train examples
(`TRAIN_EXAMPLES`), as T5's 'glue_v002_proportional'.
"""

from __future__ import annotations

from collections.abc import Sequence

import seqio
import tensorflow as tf

from ptmjax import metrics
from ptmjax.data import vocabularies
from ptmjax.tasks import registry, text_to_text

TFDS_VERSION = "2.0.0"
SPLITS = ("train", "validation", "test")
MNLI_SPLITS = ("train", "validation_matched", "validation_mismatched", "test_matched", "test_mismatched")
# config: (label names, metric functions); STS-B's targets are scores.
BENCHMARKS: dict[str, tuple[tuple[str, ...] | None, tuple]] = {
    "cola": (("unacceptable", "acceptable"), (metrics.matthews_corrcoef,)),
    "sst2": (("negative", "positive"), (metrics.accuracy,)),
    "mrpc": (("not_equivalent", "equivalent"), (metrics.f1_binary, metrics.accuracy)),
    "qqp": (("not_duplicate", "duplicate"), (metrics.f1_binary, metrics.accuracy)),
    "stsb": (None, (metrics.pearson_corrcoef, metrics.spearman_corrcoef)),
    "mnli": (("entailment", "neutral", "contradiction"), (metrics.accuracy,)),
    "qnli": (("entailment", "not_entailment"), (metrics.accuracy,)),
    "rte": (("entailment", "not_entailment"), (metrics.accuracy,)),
    "wnli": (("not_entailment", "entailment"), (metrics.accuracy,)),
}
TRAIN_EXAMPLES = {"cola": 8551, "sst2": 67349, "mrpc": 3668, "qqp": 363846, "stsb": 5749, "mnli": 392702,
                  "qnli": 104743, "rte": 2490, "wnli": 635}


def glue_preprocessor(benchmark_name: str, label_names: Sequence[str], feature_names: Sequence[str] | None = None):
    """T5's `preprocessors.glue`: '{benchmark} {key}: {value} ...' -> the label's name; keeps 'idx'.

    `feature_names` gives the order of the text features; by default every feature but 'label' and 'idx',
    sorted by name.
    """

    @seqio.map_over_dataset
    def preprocess(x: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        keys = feature_names or sorted(set(x) - {"label", "idx"})
        parts = [benchmark_name]
        for key in keys:
            parts += [f"{key}:", x[key]]
        return {"inputs": tf.strings.join(parts, separator=" "),
                "targets": text_to_text.label_text(x["label"], label_names), "idx": x["idx"]}

    return preprocess


@seqio.map_over_dataset
def stsb_preprocessor(x: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """T5's `preprocessors.stsb`: targets are the 0..5 score rounded to the nearest 0.2, as text ('3.8')."""
    inputs = tf.strings.join(["stsb sentence1:", x["sentence1"], "sentence2:", x["sentence2"]], separator=" ")
    targets = tf.strings.as_string(tf.round(x["label"] * 5) / 5, precision=1)
    return {"inputs": inputs, "targets": targets, "idx": x["idx"]}


def register_glue_tasks(
    vocabulary: seqio.Vocabulary | None = None, prefix: str = text_to_text.DEFAULT_PREFIX
) -> seqio.Mixture:
    """(Re-)registers the tasks of the module doc as '{prefix}glue_<config>' with `vocabulary` (default:
    `vocabularies.default_vocabulary()`), and returns the '{prefix}glue' mixture."""
    vocabulary = vocabulary or vocabularies.default_vocabulary()
    for config, (label_names, metric_fns) in BENCHMARKS.items():
        if label_names is None:
            preprocessor, postprocess_fn = stsb_preprocessor, text_to_text.string_to_float
        else:
            preprocessor = glue_preprocessor(config, label_names)
            postprocess_fn = text_to_text.string_label_to_class_id(label_names)
        tfds_name = f"glue/{config}:{TFDS_VERSION}"
        splits = MNLI_SPLITS if config == "mnli" else SPLITS
        text_to_text.register(f"{prefix}glue_{config}", text_to_text.tfds_source(tfds_name, splits), preprocessor,
                              vocabulary, metric_fns, postprocess_fn)
        if config == "mnli":
            for match in ("matched", "mismatched"):
                splits = {"validation": f"validation_{match}", "test": f"test_{match}"}
                text_to_text.register(f"{prefix}glue_mnli_{match}", text_to_text.tfds_source(tfds_name, splits),
                                      preprocessor, vocabulary, metric_fns, postprocess_fn)
    rates = [(f"{prefix}glue_{config}", float(count)) for config, count in TRAIN_EXAMPLES.items()]
    return registry.register_mixture(f"{prefix}glue", rates)


register_glue_tasks()
