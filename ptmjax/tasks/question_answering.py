"""Extractive QA over the embedded stdlib corpus: find the identifier or literal a cloze question blanks out.

Importing this module registers, with the stdlib SentencePiece vocabulary, 'ptmjax_stdlib_code_qa'.
Each docstring paragraph (`docstring_paragraphs`) with at least one code span (`code_spans`: an
identifier or literal, 1 to 8 words) gives one example, as in cloze-translation unsupervised QA (Lewis
et al., 2019): the answer is the span number int(SHA-256(paragraph)[:8]) mod (number of spans), so
anywhere in the paragraph (its first word opens the paragraph in 154 of the train examples), and the
question is up to `QUESTION_WINDOW` words either side of it, within the paragraph, with '___' in its
place ('Compile a ___ pattern, returning a Pattern object, deprecated' -> 'template'); a paragraph
whose question would have fewer than `MIN_QUESTION_WORDS` words beside the blank gives none. The
context is the whole paragraph: the model must find where the question's words occur and return the
span between them. Examples: 1,919 train and 221 validation on CPython 3.11 (answers of 1 word: 1,771
and 203). Features:

* 'inputs' [n] int32: the question's and the context's ids (`word_tokens.encode_words`) in the
  vocabulary's template for a pair (`head_inputs.templated`): question, EOS (the separator), context, EOS;
  with an imported tokenizer, its own (`[CLS] question [SEP] context [SEP]`, `<s> question </s></s>
  context </s>`), as transformers' `tokenizer(question, context)` gives them;
* 'token_type_ids' [n] int32: the template's token types (0 for the question and the separator, 1 for the
  context and the last EOS; an imported tokenizer's own: BERT's 0 then 1, RoBERTa's all 0);
* 'context_mask' [n] int32: 1 on the context's ids, where an answer may start and end;
* 'answer_start', 'answer_end' int32 scalars: inclusive indices into 'inputs' of the answer's first and
  last ids (whole words: decoding them gives the answer text, as the vocabulary normalises it; the first is
  the first id holding a character of the answer, `word_tokens.first_character`, as in transformers'
  question-answering examples);
* 'answers', 'context', 'question' strings: the answer text, the paragraph and the question.

With a sequence length for 'inputs' (L), a longer example keeps its first ids and the template's closing
special ids (EOS, [SEP]) within L, as transformers' `truncation="only_second"`; an example whose answer
would be cut is dropped (`num_dropped`): with the stdlib SentencePiece vocabulary 67 train and 9
validation examples at L = 128, 9 and 0 at L = 256, none at 512.

Metric: `metrics.squad` ('em', 'f1', 0-100): the postprocessor gives an example's [answer] as its target
and leaves a prediction, the decoded text of the predicted span, as it is. Chance level
(`first_tokens_baseline`: the first k context ids, k = 3 = the median answer length in ids on train) on
validation, untruncated: EM 0.45, F1 6.14.
"""

from __future__ import annotations

import functools
import hashlib
import statistics
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import seqio
import tensorflow as tf

from ptmjax import metrics
from ptmjax.data import code_spans, corpus, docstring_paragraphs, vocabularies, word_tokens
from ptmjax.tasks import head_inputs, registry, text_to_text

QA_TASK = "ptmjax_stdlib_code_qa"
QUESTION_WINDOW = 6
MIN_QUESTION_WORDS = 3
BLANK = "___"


class ClozeQuestion(NamedTuple):
    """A question's words, and the context's words with the answer's first and last word index."""

    question: tuple[str, ...]
    context: tuple[str, ...]
    first: int
    last: int

    @property
    def answer(self) -> str:
        return " ".join(self.context[self.first : self.last + 1])


@functools.cache
def cloze_questions(split: str) -> tuple[ClozeQuestion, ...]:
    """One question per paragraph of `split` that has a code span (see the module doc)."""
    questions = []
    for module, words in docstring_paragraphs.docstring_paragraphs(split):
        spans = code_spans.code_spans(words, module)
        if not spans:
            continue
        digest = hashlib.sha256(" ".join(words).encode("utf-8")).digest()
        first, last, _ = spans[int.from_bytes(digest[:8], "big") % len(spans)]
        before, after = words[max(0, first - QUESTION_WINDOW) : first], words[last + 1 : last + 1 + QUESTION_WINDOW]
        if len(before) + len(after) < MIN_QUESTION_WORDS:
            continue
        questions.append(ClozeQuestion((*before, BLANK, *after), words, first, last))
    return tuple(questions)


def qa_features(question: ClozeQuestion, vocabulary: seqio.Vocabulary) -> dict[str, Any]:
    """The untruncated features of one example (see the module doc)."""
    question_ids, _ = word_tokens.encode_words(vocabulary, question.question)
    context_ids, starts = word_tokens.encode_words(vocabulary, question.context)
    placed = head_inputs.templated(head_inputs.template(vocabulary, True, QA_TASK), [question_ids, context_ids])
    offset = placed.starts[1]
    context_mask = np.zeros(len(placed.ids), np.int32)
    context_mask[offset : offset + len(context_ids)] = 1
    after_answer = starts[question.last + 1] if question.last + 1 < len(starts) else len(context_ids)
    return {
        "inputs": placed.ids,
        "token_type_ids": placed.type_ids,
        "context_mask": context_mask,
        "answer_start": np.int32(offset + word_tokens.first_character(vocabulary, context_ids, starts[question.first])),
        "answer_end": np.int32(offset + after_answer - 1),
        "answers": question.answer,
        "context": " ".join(question.context),
        "question": " ".join(question.question),
    }


_SEQUENCES = ("inputs", "token_type_ids", "context_mask")
_SIGNATURE = {
    **{key: tf.TensorSpec([None], tf.int32) for key in _SEQUENCES},
    **{key: tf.TensorSpec([], tf.int32) for key in ("answer_start", "answer_end")},
    **{key: tf.TensorSpec([], tf.string) for key in ("answers", "context", "question")},
}


def qa_dataset_fn(
    split: str, shuffle_files: bool, seed: int | None = None, *, vocabulary: seqio.Vocabulary
) -> tf.data.Dataset:
    """seqio `FunctionDataSource` dataset_fn of the features of the module doc, untruncated."""
    examples = [qa_features(question, vocabulary) for question in cloze_questions(split)]
    dataset = tf.data.Dataset.from_generator(lambda: iter(examples), output_signature=_SIGNATURE)
    if shuffle_files:
        dataset = dataset.shuffle(len(examples), seed=seed, reshuffle_each_iteration=True)
    return dataset


def truncate_qa(
    dataset: tf.data.Dataset, sequence_length: Mapping[str, int] | None, suffix: int = 1
) -> tf.data.Dataset:
    """Drops examples whose answer a cut to sequence_length['inputs'] would lose and cuts the rest, keeping the
    `suffix` closing special ids (no length: unchanged)."""
    length = (sequence_length or {}).get("inputs")
    if length is None:
        return dataset
    dataset = dataset.filter(lambda features: features["answer_end"] < length - suffix)
    return dataset.map(lambda features: {**features, **head_inputs.cut_keeping_suffix(features, _SEQUENCES, length,
                                                                                       suffix)},
                       num_parallel_calls=tf.data.AUTOTUNE)


def num_dropped(split: str, length: int, vocabulary: seqio.Vocabulary | None = None) -> int:
    """How many examples of `split` `truncate_qa` drops at inputs length `length`."""
    vocabulary = vocabulary or vocabularies.stdlib_sentencepiece_vocabulary()
    kept = length - head_inputs.suffix_length(head_inputs.template(vocabulary, True, QA_TASK))
    return sum(int(qa_features(q, vocabulary)["answer_end"]) >= kept for q in cloze_questions(split))


def answers_postprocessor(output: Any, example: Mapping[str, Any] | None = None, is_target: bool = False) -> Any:
    """A target: [the example's answer text]; a prediction (the predicted span's text) as it is."""
    return [text_to_text.as_text(example["answers"])] if is_target else output


def first_tokens_baseline(split: str = "validation", vocabulary: seqio.Vocabulary | None = None) -> dict[str, float]:
    """`metrics.squad` on `split` of answering with the first k context ids, k the median answer length (in
    ids) on 'train', and k itself: the chance level."""
    vocabulary = vocabulary or vocabularies.stdlib_sentencepiece_vocabulary()
    train = [qa_features(question, vocabulary) for question in cloze_questions("train")]
    k = round(statistics.median(int(f["answer_end"]) - int(f["answer_start"]) + 1 for f in train))
    targets, predictions = [], []
    for question in cloze_questions(split):
        features = qa_features(question, vocabulary)
        context_start = int(np.argmax(features["context_mask"]))
        predictions.append(vocabulary.decode(features["inputs"][context_start : context_start + k].tolist()))
        targets.append([question.answer])
    return {**metrics.squad(targets, predictions), "k": float(k)}


def register_qa_task(vocabulary: seqio.Vocabulary | None = None) -> seqio.Task:
    """(Re-)registers the task of the module doc; vocabulary defaults to the stdlib SentencePiece one (an
    imported model's: `register_qa_task.vocabulary = @folder_vocabulary()`)."""
    vocabulary = vocabulary or vocabularies.stdlib_sentencepiece_vocabulary()
    source = seqio.FunctionDataSource(functools.partial(qa_dataset_fn, vocabulary=vocabulary), splits=corpus.SPLITS)
    ids = seqio.PassThroughVocabulary(2)
    features = {"inputs": seqio.Feature(vocabulary, add_eos=True),
                **{key: seqio.Feature(ids, add_eos=False) for key in ("token_type_ids", "context_mask")},
                **{key: seqio.Feature(ids, add_eos=False, rank=0) for key in ("answer_start", "answer_end")}}
    suffix = head_inputs.suffix_length(head_inputs.template(vocabulary, True, QA_TASK))
    truncate = functools.partial(truncate_qa, suffix=suffix)
    return registry.register_task(QA_TASK, source, [truncate], vocabulary, [metrics.squad], answers_postprocessor,
                                  features)


register_qa_task()
