"""The cloze QA task: a hand-checked example, answer spans that decode to the answer, cuts, the chance level."""

import numpy as np
import pytest
import seqio

from ptmjax import metrics
from ptmjax.data import vocabularies
from ptmjax.tasks import question_answering

ABC_CONTEXT = "If cls is not an instance of ABCMeta, does nothing."


def test_a_known_paragraph_gives_its_hand_checked_question_and_span():
    vocabulary = vocabularies.stdlib_sentencepiece_vocabulary()
    question = next(q for q in question_answering.cloze_questions("validation") if " ".join(q.context) == ABC_CONTEXT)
    # Its spans: 'ABCMeta,' (abc.ABCMeta) is the only one; 6 words before it, 2 after.
    assert question.question == ("cls", "is", "not", "an", "instance", "of", "___", "does", "nothing.")
    assert question.answer == "ABCMeta,"
    features = question_answering.qa_features(question, vocabulary)
    inputs, types = features["inputs"].tolist(), features["token_type_ids"].tolist()
    separator = inputs.index(1)
    assert vocabulary.decode(inputs[:separator]) == "cls is not an instance of ___ does nothing."
    assert types == [0] * (separator + 1) + [1] * (len(inputs) - separator - 1) and inputs[-1] == 1
    assert vocabulary.decode(inputs[separator + 1 :]) == ABC_CONTEXT
    assert vocabulary.decode(inputs[features["answer_start"] : features["answer_end"] + 1]) == "ABCMeta,"
    # 'ABCMeta' opens with a bare '▁' piece; the answer starts after it, at its first character.
    assert vocabulary.decode(inputs[separator + 1 : features["answer_start"]]) == "If cls is not an instance of "


def test_every_answer_span_decodes_to_the_answer_and_lies_in_the_context():
    vocabulary = vocabularies.stdlib_sentencepiece_vocabulary()
    questions = question_answering.cloze_questions("validation")
    assert len(questions) == 221 and len(question_answering.cloze_questions("train")) == 1919
    assert not {q.context for q in questions} & {q.context for q in question_answering.cloze_questions("train")}
    for question in questions:
        features = question_answering.qa_features(question, vocabulary)
        start, end = int(features["answer_start"]), int(features["answer_end"])
        assert features["token_type_ids"][start] == 1 and start <= end < len(features["inputs"]) - 1
        span = vocabulary.decode(features["inputs"][start : end + 1].tolist())
        assert span == vocabulary.decode(vocabulary.encode(question.answer))  # as SentencePiece normalises it
    assert sum(q.first > 0 for q in questions) == 206  # mostly not at the start of the context


def test_seqio_dataset_drops_examples_whose_answer_a_cut_would_lose():
    task = seqio.get_mixture_or_task(question_answering.QA_TASK)
    examples = list(task.get_dataset({"inputs": 64}, split="validation", shuffle=False).as_numpy_iterator())
    assert len(examples) == 221 - question_answering.num_dropped("validation", 64) == 170
    vocabulary = vocabularies.stdlib_sentencepiece_vocabulary()
    for example in examples:
        assert example["inputs"].dtype == example["token_type_ids"].dtype == example["answer_start"].dtype == np.int32
        assert len(example["inputs"]) == len(example["token_type_ids"]) <= 64 and example["inputs"][-1] == 1
        assert example["answer_end"] < len(example["inputs"]) - 1
        span = example["inputs"][example["answer_start"] : example["answer_end"] + 1].tolist()
        assert vocabulary.decode(span) == vocabulary.decode(vocabulary.encode(example["answers"].decode()))
        assert example["answers"].decode() in example["context"].decode()
    assert (question_answering.num_dropped("validation", 128), question_answering.num_dropped("train", 128)) == (9, 67)


def test_targets_are_the_answer_and_the_chance_level_is_low():
    example = {"answers": b"ABCMeta,"}
    assert question_answering.answers_postprocessor("x", example, is_target=True) == ["ABCMeta,"]
    assert question_answering.answers_postprocessor("ABCMeta", example) == "ABCMeta"
    assert metrics.squad([["ABCMeta,"]], ["ABCMeta"]) == {"em": 100.0, "f1": 100.0}
    baseline = question_answering.first_tokens_baseline()
    assert baseline["k"] == 3 and baseline["em"] == pytest.approx(100 / 221)
    assert baseline["f1"] == pytest.approx(6.14, abs=0.005)
