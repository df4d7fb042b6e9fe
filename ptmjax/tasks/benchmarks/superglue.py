"""SuperGLUE as T5 casts it to text: seqio tasks over TFDS 'super_glue/<config>:1.0.2', and their mixture.

Importing this module registers, with `vocabularies.default_vocabulary()` (nothing is read):

| task ('ptmjax_' + ) | inputs | targets | metrics |
|---|---|---|---|
| super_glue_boolq | 'boolq passage: {p} question: {q}' | False / True | accuracy |
| super_glue_cb | 'cb hypothesis: {h} premise: {p}' | entailment/contradiction/neutral | mean_3class_f1, accuracy |
| super_glue_copa | 'copa choice1: {c1} choice2: {c2} premise: {p} question: {q}' | choice1/choice2 | accuracy |
| super_glue_multirc | 'multirc question: {q} answer: {a} paragraph: {p}' | False / True | f1, exact_match |
| super_glue_record | 'record query: {q} entities: {e1, e2} passage: {p}' | an answer entity | em, f1 |
| super_glue_rte | 'rte hypothesis: {h} premise: {p}' | entailment / not_entailment | accuracy |
| super_glue_wic | 'wic sentence1: {s1} sentence2: {s2} word: {w}' | False / True | accuracy |
| super_glue_wsc | 'wsc text: {text with * span1 * and # span2 #}' | False / True | accuracy |

As T5's 'super_glue_*_v102' tasks (`glue.glue_preprocessor`, T5's `wsc` and `record` preprocessors; WSC
is 'wsc.fixed', in T5's marked-span format rather than its later 'wsc_simple'). The grouped metrics are
T5's, not simplified:

* MultiRC: one example per (question, answer) pair, HTML ('<br>', '<b>') removed from the paragraph;
  'f1' is the binary F1 over all answers, 'exact_match' the % of questions (grouped by paragraph and
  question index) whose answers are all classified right.
* ReCoRD: one example per gold answer (an unanswerable query gets the target '<unk>'); the metric
  scores the first example of each query against all its gold answers (SQuAD EM and F1).

'ptmjax_super_glue' mixes the eight training tasks in proportion to their TFDS train examples
(`TRAIN_EXAMPLES`, ReCoRD counted in queries before the per-answer split), as T5 mixes by example count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import seqio
import tensorflow as tf

from ptmjax import metrics
from ptmjax.data import vocabularies
from ptmjax.tasks import registry, text_to_text
from ptmjax.tasks.benchmarks.glue import glue_preprocessor

TFDS_VERSION = "1.0.2"
SPLITS = ("train", "validation", "test")
BINARY = ("False", "True")
TRAIN_EXAMPLES = {"boolq": 9427, "cb": 250, "copa": 400, "multirc": 27243, "record": 100730, "rte": 2490,
                  "wic": 5428, "wsc.fixed": 554}


@seqio.map_over_dataset
def multirc_preprocessor(x: dict[str, Any]) -> dict[str, tf.Tensor]:
    """'multirc question: {q} answer: {a} paragraph: {p}' (HTML removed) -> False / True; keeps the indices."""
    paragraph = tf.strings.regex_replace(x["paragraph"], "<br>", " ")
    paragraph = tf.strings.regex_replace(paragraph, "<(/)?b>", "")
    inputs = tf.strings.join(
        ["multirc question:", x["question"], "answer:", x["answer"], "paragraph:", paragraph], separator=" "
    )
    return {"inputs": inputs, "targets": text_to_text.label_text(x["label"], BINARY),
            "idx/paragraph": x["idx"]["paragraph"], "idx/question": x["idx"]["question"]}


def multirc_postprocessor(text: str, example: Mapping[str, Any] | None = None, is_target: bool = False) -> dict:
    """{'value': class id (-1: no label)}, plus the question's 'group' for a target."""
    result: dict[str, Any] = {"value": BINARY.index(text) if text in BINARY else -1}
    if is_target:
        result["group"] = (int(example["idx/paragraph"]), int(example["idx/question"]))
    return result


def record_preprocessor(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """T5's `preprocessors.record`: one example per gold answer, 'record query: {q} entities: {e1, e2}
    passage: {p}' with the '@highlight' lines of the passage joined as sentences; keeps all 'answers'."""

    def per_answer(x: dict[str, Any]) -> dict[str, tf.Tensor]:
        answers = x["answers"]
        count = tf.maximum(tf.size(answers), 1)
        passage = tf.strings.regex_replace(x["passage"], r"(\.|\?|\!|\"|\')\n@highlight\n", r"\1 ")
        passage = tf.strings.regex_replace(passage, r"\n@highlight\n", ". ")
        inputs = tf.strings.join(["record query:", x["query"], "entities:",
                                  tf.strings.reduce_join(x["entities"], separator=", "), "passage:", passage],
                                 separator=" ")

        def repeat(tensor: tf.Tensor) -> tf.Tensor:
            return tf.broadcast_to(tensor, tf.concat([[count], tf.shape(tensor)], axis=0))

        targets = tf.cond(tf.size(answers) > 0, lambda: answers, lambda: tf.constant(["<unk>"]))
        return {"inputs": repeat(inputs), "targets": targets, "answers": repeat(answers),
                "idx/passage": repeat(x["idx"]["passage"]), "idx/query": repeat(x["idx"]["query"])}

    return dataset.map(per_answer, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


def record_postprocessor(text: str, example: Mapping[str, Any] | None = None, is_target: bool = False) -> dict:
    """{'value': the predicted text}; a target's value is every gold answer, with the query's 'group'."""
    if not is_target:
        return {"value": text}
    return {"value": [text_to_text.as_text(answer) for answer in example["answers"]],
            "group": (int(example["idx/passage"]), int(example["idx/query"]))}


def _mark_span(text: tf.Tensor, span: tf.Tensor, word_index: tf.Tensor, mark: str) -> tf.Tensor:
    """Surrounds `span`, found at whitespace-separated word `word_index` of `text`, with `mark`."""
    escaped = tf.strings.regex_replace(span, r"([.^$|?*+()\[\]{}\\])", r"\\\1")
    pattern = tf.strings.join([r"^((?:\S+\s){", tf.strings.as_string(word_index), "})(", escaped, ")"])
    return tf.strings.regex_replace(text, pattern, rf"\1{mark} \2 {mark}")


@seqio.map_over_dataset
def wsc_preprocessor(x: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """T5's `preprocessors.wsc`: 'wsc text: ...' with the noun span in '* *' and the pronoun in '# #'."""
    text = _mark_span(x["text"], x["span1_text"], x["span1_index"], "*")
    span2_index = x["span2_index"] + 2 * tf.cast(x["span1_index"] < x["span2_index"], tf.int32)  # the 2 '*'
    text = _mark_span(text, x["span2_text"], span2_index, "#")
    return {"inputs": tf.strings.join(["wsc text:", text], separator=" "),
            "targets": text_to_text.label_text(x["label"], BINARY), "idx": x["idx"]}


def register_super_glue_tasks(
    vocabulary: seqio.Vocabulary | None = None, prefix: str = text_to_text.DEFAULT_PREFIX
) -> seqio.Mixture:
    """(Re-)registers the tasks of the module doc as '{prefix}super_glue_<name>' with `vocabulary` (default:
    `vocabularies.default_vocabulary()`), and returns the '{prefix}super_glue' mixture."""
    vocabulary = vocabulary or vocabularies.default_vocabulary()
    label_id = text_to_text.string_label_to_class_id
    cb_labels, rte_labels = ("entailment", "contradiction", "neutral"), ("entailment", "not_entailment")
    # config: (preprocessor, metric functions, postprocessor)
    benchmarks = {
        "boolq": (glue_preprocessor("boolq", BINARY), (metrics.accuracy,), label_id(BINARY)),
        "cb": (glue_preprocessor("cb", cb_labels), (metrics.multiclass_f1(3), metrics.accuracy), label_id(cb_labels)),
        "copa": (glue_preprocessor("copa", ("choice1", "choice2")), (metrics.accuracy,),
                 label_id(("choice1", "choice2"))),
        "multirc": (multirc_preprocessor, (metrics.multirc,), multirc_postprocessor),
        "record": (record_preprocessor, (metrics.record,), record_postprocessor),
        "rte": (glue_preprocessor("rte", rte_labels), (metrics.accuracy,), label_id(rte_labels)),
        "wic": (glue_preprocessor("wic", BINARY, ("sentence1", "sentence2", "word")), (metrics.accuracy,),
                label_id(BINARY)),
        "wsc.fixed": (wsc_preprocessor, (metrics.accuracy,), label_id(BINARY)),
    }
    names = {}
    for config, (preprocessor, metric_fns, postprocess_fn) in benchmarks.items():
        names[config] = f"{prefix}super_glue_{config.removesuffix('.fixed')}"
        source = text_to_text.tfds_source(f"super_glue/{config}:{TFDS_VERSION}", SPLITS)
        text_to_text.register(names[config], source, preprocessor, vocabulary, metric_fns, postprocess_fn)
    rates = [(names[config], float(count)) for config, count in TRAIN_EXAMPLES.items()]
    return registry.register_mixture(f"{prefix}super_glue", rates)


register_super_glue_tasks()
