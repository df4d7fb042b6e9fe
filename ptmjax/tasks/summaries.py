"""An offline generative downstream task over the embedded stdlib corpus: a docstring's summary line from its body.

Importing this module registers, with the stdlib SentencePiece vocabulary:

* 'ptmjax_stdlib_docstring_summary': inputs 'summarize: ' + the docstring's body (everything after its
  first blank line), targets its summary line, both with EOS; metrics 'rouge1', 'rouge2', 'rougeLsum'
  (`ptmjax.metrics.rouge`). Only docstrings in PEP 257 form qualify: a one-line first
  paragraph that reads as prose (an upper-case letter, then a lower-case one or a space; at least `MIN_SUMMARY_WORDS`
  words, not a call signature such as 'deque([iterable]) --> deque object' or 'SelectorKey(fileobj, fd)'),
  then a body of at least `MIN_BODY_WORDS` words. The splits are the corpus' own ('train',
  'validation'), in corpus order: 660 and 40 examples on CPython 3.11.
"""

from __future__ import annotations

import functools
import re

import seqio
import tensorflow as tf

from ptmjax import metrics
from ptmjax.data import corpus, vocabularies
from ptmjax.tasks import text_to_text

SUMMARY_TASK = "ptmjax_stdlib_docstring_summary"
MIN_SUMMARY_WORDS = 3
MIN_BODY_WORDS = 8
_PROSE = re.compile(r"[A-Z][a-z\s]")
_SIGNATURE = re.compile(r"\S*\(|.*->")


def summary_and_body(document: str) -> tuple[str, str] | None:
    """(summary line, body) of a docstring in PEP 257 form as the module doc defines it, else None."""
    first, _, body = document.partition("\n\n")
    summary, body = first.strip(), body.strip()
    if "\n" in summary or not _PROSE.match(summary) or _SIGNATURE.match(summary):
        return None
    if len(summary.split()) < MIN_SUMMARY_WORDS or len(body.split()) < MIN_BODY_WORDS:
        return None
    return summary, body


@functools.cache
def docstring_summary_examples(split: str) -> tuple[tuple[str, str], ...]:
    """(body, summary line) pairs of one corpus split, in corpus order."""
    pairs = (summary_and_body(document) for document in corpus.stdlib_docstrings(split))
    return tuple((body, summary) for summary, body in filter(None, pairs))


def docstring_summary_dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
    """seqio `FunctionDataSource` dataset_fn: {'inputs': 'summarize: ' + body, 'targets': summary} (tf.string)."""
    examples = docstring_summary_examples(split)
    dataset = tf.data.Dataset.from_tensor_slices(
        {"inputs": [f"summarize: {body}" for body, _ in examples], "targets": [summary for _, summary in examples]}
    )
    if shuffle_files:
        dataset = dataset.shuffle(len(examples), seed=seed, reshuffle_each_iteration=True)
    return dataset


def register_summary_task(vocabulary: seqio.Vocabulary | None = None) -> seqio.Task:
    """(Re-)registers the task of the module doc; vocabulary defaults to the stdlib SentencePiece one."""
    source = seqio.FunctionDataSource(docstring_summary_dataset_fn, splits=corpus.SPLITS)
    return text_to_text.register(SUMMARY_TASK, source, None,
                                vocabulary or vocabularies.stdlib_sentencepiece_vocabulary(), (metrics.rouge,))


register_summary_task()
