"""The GLUE, SuperGLUE, SQuAD, summarization and translation tasks over mocked TFDS data.

Every task is registered again with a byte vocabulary under the prefix 'test_' (nothing to train) and read
through `tfds.testing.mock_data` with hand-written examples in each dataset's features. Each test checks
the preprocessed text of the first example, then scores perfect and wrong predictions the way seqio's
evaluator does: the task's postprocessor on the decoded target and prediction, then its metric functions.
"""

import pytest
import seqio
import tensorflow as tf
import tensorflow_datasets as tfds

from ptmjax.data import vocabularies
from ptmjax.tasks import text_to_text
from ptmjax.tasks.benchmarks import glue, squad, summarization, superglue, translation

PREFIX = "test_"
WSC_TEXT = "Mark told Pete many lies about himself, which Pete included in his book. He should have been more truthful."
MULTIRC_PARAGRAPH = "<b>Sent 1: </b>Tom ran home.<br><b>Sent 2: </b>Ann sat."
RECORD_PASSAGE = "Obama visited Paris.\n@highlight\nHe met Macron\n@highlight\nThey ate"


def pair(key1, key2, *rows):
    """Examples of a two-text dataset: rows of (text1, text2, label)."""
    return [{key1: a, key2: b, "label": label, "idx": i} for i, (a, b, label) in enumerate(rows)]


# (TFDS name, config) -> examples, or {TFDS split: examples}.
FIXTURES = {
    ("glue", "cola"): [{"sentence": "The cat sat.", "label": 1, "idx": 0},
                       {"sentence": "Cat the sat.", "label": 0, "idx": 1}],
    ("glue", "sst2"): [{"sentence": "a gripping film", "label": 1, "idx": 0},
                       {"sentence": "dull", "label": 0, "idx": 1}],
    ("glue", "mrpc"): pair("sentence1", "sentence2", ("He left.", "He went away.", 1), ("It rains.", "I sing.", 0)),
    ("glue", "qqp"): pair("question1", "question2", ("How old?", "What age?", 1), ("Why?", "Where?", 0)),
    ("glue", "stsb"): pair("sentence1", "sentence2", ("A dog runs.", "A dog is running.", 3.84),
                           ("A man eats.", "It snows.", 0.5)),
    ("glue", "mnli"): {"validation_matched": pair("premise", "hypothesis", ("A dog runs.", "An animal moves.", 0)),
                       "validation_mismatched": pair("premise", "hypothesis", ("It is day.", "It is night.", 2))},
    ("glue", "qnli"): pair("question", "sentence", ("Who ran?", "The sky is blue.", 1)),
    ("glue", "rte"): pair("sentence1", "sentence2", ("Tom bought a car.", "Tom owns a car.", 0)),
    ("glue", "wnli"): pair("sentence1", "sentence2", ("The cup fell because it was light.", "The cup was light.", 1)),
    ("super_glue", "boolq"): [{"question": "is the sky blue", "passage": "The sky is blue.", "label": 1, "idx": 0}],
    ("super_glue", "cb"): pair("premise", "hypothesis", ("It is raining.", "It is wet.", 0),
                               ("It is raining.", "It is dry.", 1), ("Ann is here.", "Tom is here.", 2)),
    ("super_glue", "copa"): [{"premise": "The man broke his toe.", "choice1": "He dropped a hammer on his foot.",
                              "choice2": "He got a hole in his sock.", "question": "cause", "label": 0, "idx": 0}],
    ("super_glue", "multirc"): [
        {"paragraph": MULTIRC_PARAGRAPH, "question": "Who ran?", "answer": "Tom", "label": 1,
         "idx": {"paragraph": 0, "question": 0, "answer": 0}},
        {"paragraph": MULTIRC_PARAGRAPH, "question": "Who ran?", "answer": "Ann", "label": 0,
         "idx": {"paragraph": 0, "question": 0, "answer": 1}},
        {"paragraph": MULTIRC_PARAGRAPH, "question": "Where to?", "answer": "home", "label": 1,
         "idx": {"paragraph": 0, "question": 1, "answer": 0}},
    ],
    ("super_glue", "record"): [
        {"passage": RECORD_PASSAGE, "query": "@placeholder visited the city", "entities": ["Obama", "Paris", "Macron"],
         "answers": ["Obama", "Barack Obama"], "idx": {"passage": 0, "query": 0}},
        {"passage": RECORD_PASSAGE, "query": "Obama met @placeholder", "entities": ["Obama", "Paris", "Macron"],
         "answers": ["Macron"], "idx": {"passage": 0, "query": 1}},
    ],
    ("super_glue", "rte"): pair("premise", "hypothesis", ("Tom bought a car.", "Tom sold a car.", 1)),
    ("super_glue", "wic"): [{"word": "bank", "sentence1": "He sat on the bank.", "sentence2": "The bank closed.",
                             "start1": 14, "start2": 4, "end1": 18, "end2": 8, "label": 0, "idx": 0}],
    ("super_glue", "wsc.fixed"): [
        {"text": WSC_TEXT, "span1_index": 0, "span1_text": "Mark", "span2_index": 13, "span2_text": "He",
         "label": 1, "idx": 0},
        {"text": "Dr. Who (the doctor) left. He was tired.", "span1_index": 0, "span1_text": "Dr. Who (the doctor)",
         "span2_index": 5, "span2_text": "He", "label": 1, "idx": 1},
    ],
    ("squad", "v1.1"): [{"id": "q1", "title": "Tower", "context": "The tower (built 1889) is in Paris.",
                         "question": "Where's the tower?",
                         "answers": {"text": ["Paris", "in Paris"], "answer_start": [28, 25]}}],
    ("cnn_dailymail", None): [{"article": "The council met today.", "highlights": "Council meets .\nNo decision .",
                               "id": "a1", "publisher": "cnn"}],
    ("xsum", None): [{"document": "The council met today.", "summary": "The council met but decided nothing."}],
    ("wmt14_translate", "de-en"): [{"en": "The house is small and old.", "de": "Das Haus ist klein und alt."}],
}


def mock_as_dataset(builder, split, *args, **kwargs):
    """The fixture examples of the builder's dataset (per split where given), typed by its features."""
    config = builder.builder_config.name if builder.builder_config else None
    examples = FIXTURES[(builder.name, config)]
    examples = examples[split] if isinstance(examples, dict) else examples
    return tf.data.Dataset.from_generator(lambda: iter(examples),
                                          output_signature=builder.info.features.get_tensor_spec())


@pytest.fixture(scope="module", autouse=True)
def byte_tasks():
    vocabulary = vocabularies.byte_vocabulary()
    glue.register_glue_tasks(vocabulary, PREFIX)
    superglue.register_super_glue_tasks(vocabulary, PREFIX)
    squad.register_squad_task(vocabulary, PREFIX)
    summarization.register_summarization_tasks(vocabulary, PREFIX)
    translation.register_translation_task(vocabulary, PREFIX)
    with tfds.testing.mock_data(as_dataset_fn=mock_as_dataset):
        yield


def examples_of(task_name: str, split: str) -> list[dict]:
    task = seqio.get_mixture_or_task(task_name)
    return list(task.get_dataset(None, split=split, shuffle=False, use_cached=False,
                                 try_in_mem_cache=False).as_numpy_iterator())  # mocked TFDS has no split sizes


def evaluate(task_name: str, examples: list[dict], predictions: list[str]) -> dict[str, float]:
    """The task's metrics of `predictions` as seqio's evaluator computes them."""
    task = seqio.get_mixture_or_task(task_name)
    targets = [task.postprocess_fn(text_to_text.as_text(ex["targets_pretokenized"]), example=ex, is_target=True)
               for ex in examples]
    pairs = zip(examples, predictions, strict=True)
    predicted = [task.postprocess_fn(text, example=ex, is_target=False) for ex, text in pairs]
    results = {}
    for metric_fn in task.predict_metric_fns:
        results.update(metric_fn(targets, predicted))
    return results


# task, split, first inputs, first targets, metric keys, a wrong prediction per example
CASES = [
    ("glue_cola", "validation", "cola sentence: The cat sat.", "acceptable", {"matthews_corrcoef"},
     ["unacceptable", "acceptable"]),
    ("glue_sst2", "validation", "sst2 sentence: a gripping film", "positive", {"accuracy"}, ["negative", "positive"]),
    ("glue_mrpc", "validation", "mrpc sentence1: He left. sentence2: He went away.", "equivalent", {"f1", "accuracy"},
     ["not_equivalent", "equivalent"]),
    ("glue_qqp", "validation", "qqp question1: How old? question2: What age?", "duplicate", {"f1", "accuracy"},
     ["no idea", "duplicate"]),
    ("glue_stsb", "validation", "stsb sentence1: A dog runs. sentence2: A dog is running.", "3.8",
     {"pearson_corrcoef", "spearman_corrcoef"}, ["0.4", "3.8"]),
    ("glue_mnli", "validation_mismatched", "mnli hypothesis: It is night. premise: It is day.", "contradiction",
     {"accuracy"}, ["neutral"]),
    ("glue_mnli_matched", "validation", "mnli hypothesis: An animal moves. premise: A dog runs.", "entailment",
     {"accuracy"}, ["neutral"]),
    ("glue_mnli_mismatched", "validation", "mnli hypothesis: It is night. premise: It is day.", "contradiction",
     {"accuracy"}, ["entailment"]),
    ("glue_qnli", "validation", "qnli question: Who ran? sentence: The sky is blue.", "not_entailment", {"accuracy"},
     ["entailment"]),
    ("glue_rte", "validation", "rte sentence1: Tom bought a car. sentence2: Tom owns a car.", "entailment",
     {"accuracy"}, ["not_entailment"]),
    ("glue_wnli", "validation", "wnli sentence1: The cup fell because it was light. sentence2: The cup was light.",
     "entailment", {"accuracy"}, ["not_entailment"]),
    ("super_glue_boolq", "validation", "boolq passage: The sky is blue. question: is the sky blue", "True",
     {"accuracy"}, ["False"]),
    ("super_glue_cb", "validation", "cb hypothesis: It is wet. premise: It is raining.", "entailment",
     {"mean_3class_f1", "accuracy"}, ["entailment", "neutral", "neutral"]),
    ("super_glue_copa", "validation", "copa choice1: He dropped a hammer on his foot. choice2: He got a hole in his "
     "sock. premise: The man broke his toe. question: cause", "choice1", {"accuracy"}, ["choice2"]),
    ("super_glue_multirc", "validation", "multirc question: Who ran? answer: Tom paragraph: Sent 1: Tom ran home. "
     "Sent 2: Ann sat.", "True", {"f1", "exact_match"}, ["True", "True", "True"]),
    ("super_glue_record", "validation", "record query: @placeholder visited the city entities: Obama, Paris, Macron "
     "passage: Obama visited Paris. He met Macron. They ate", "Obama", {"em", "f1"}, ["Paris", "Paris", "Macron"]),
    ("super_glue_rte", "validation", "rte hypothesis: Tom sold a car. premise: Tom bought a car.", "not_entailment",
     {"accuracy"}, ["entailment"]),
    ("super_glue_wic", "validation", "wic sentence1: He sat on the bank. sentence2: The bank closed. word: bank",
     "False", {"accuracy"}, ["True"]),
    ("super_glue_wsc", "validation", "wsc text: * Mark * told Pete many lies about himself, which Pete included in "
     "his book. # He # should have been more truthful.", "True", {"accuracy"}, ["False", "False"]),
    ("squad", "validation", "question: Where ' s the tower ? context: The tower ( built 1889 ) is in Paris . ",
     "Paris", {"em", "f1"}, ["London"]),
    ("cnn_dailymail", "validation", "summarize: The council met today.", "Council meets .\nNo decision .",
     {"rouge1", "rouge2", "rougeLsum"}, ["Something else entirely"]),
    ("xsum", "test", "summarize: The council met today.", "The council met but decided nothing.",
     {"rouge1", "rouge2", "rougeLsum"}, ["Rain is expected"]),
    ("wmt14_ende", "test", "translate English to German: The house is small and old.", "Das Haus ist klein und alt.",
     {"bleu"}, ["Der Hund ist gross."]),
]


@pytest.mark.parametrize(("name", "split", "inputs", "targets", "keys", "wrong"), CASES, ids=[c[0] for c in CASES])
def test_task_text_and_metrics(name, split, inputs, targets, keys, wrong):
    examples = examples_of(PREFIX + name, split)
    assert len(examples) == len(wrong)
    assert text_to_text.as_text(examples[0]["inputs_pretokenized"]) == inputs
    assert text_to_text.as_text(examples[0]["targets_pretokenized"]) == targets
    assert examples[0]["targets"][-1] == 1  # EOS
    perfect = evaluate(PREFIX + name, examples, [text_to_text.as_text(ex["targets_pretokenized"]) for ex in examples])
    assert set(perfect) == keys and all(value == pytest.approx(100.0) for value in perfect.values()), perfect
    imperfect = evaluate(PREFIX + name, examples, wrong)
    assert set(imperfect) == keys and all(value < 99.0 for value in imperfect.values()), imperfect


def test_stsb_targets_round_to_a_fifth_and_score_as_floats():
    examples = examples_of(PREFIX + "glue_stsb", "validation")
    assert [text_to_text.as_text(ex["targets_pretokenized"]) for ex in examples] == ["3.8", "0.4"]  # tf.round: 2.5 -> 2
    assert seqio.get_mixture_or_task(PREFIX + "glue_stsb").postprocess_fn("not a number") == -1.0


def test_wsc_marks_spans_with_regex_characters_and_record_keeps_every_answer():
    wsc = examples_of(PREFIX + "super_glue_wsc", "validation")
    wsc_inputs = text_to_text.as_text(wsc[1]["inputs_pretokenized"])
    assert wsc_inputs == "wsc text: * Dr. Who (the doctor) * left. # He # was tired."
    record = examples_of(PREFIX + "super_glue_record", "validation")
    assert [text_to_text.as_text(ex["targets_pretokenized"]) for ex in record] == ["Obama", "Barack Obama", "Macron"]
    assert evaluate(PREFIX + "super_glue_record", record, ["Barack Obama", "x", "Macron"]) == {"em": 100.0, "f1": 100.0}


def test_default_registration_reads_nothing_and_mixes_by_train_examples(monkeypatch):
    def no_reading(*args, **kwargs):
        raise AssertionError("registration read TFDS")

    monkeypatch.setattr(tfds, "builder", no_reading)
    glue_mixture = glue.register_glue_tasks()
    superglue_mixture = superglue.register_super_glue_tasks()
    assert squad.register_squad_task().name == "ptmjax_squad"
    summaries = summarization.register_summarization_tasks()
    assert [task.name for task in summaries] == ["ptmjax_cnn_dailymail", "ptmjax_xsum"]
    assert translation.register_translation_task().name == "ptmjax_wmt14_ende"
    task = seqio.get_mixture_or_task("ptmjax_glue_cola")
    assert task.output_features["targets"].vocabulary == vocabularies.default_vocabulary()
    assert glue_mixture.name == "ptmjax_glue" and len(glue_mixture.tasks) == 9
    assert glue_mixture.get_rate(seqio.get_mixture_or_task("ptmjax_glue_mnli")) == 392702
    assert superglue_mixture.name == "ptmjax_super_glue" and len(superglue_mixture.tasks) == 8
    assert superglue_mixture.get_rate(seqio.get_mixture_or_task("ptmjax_super_glue_wsc")) == 554
