"""Long-document tasks over whole standard-library source files (ptmjax/data/stdlib_sources.py).

Importing this module registers, with the stdlib SentencePiece vocabulary:

* 'ptmjax_stdlib_long_lm': causal language modelling over whole source files. Each file is tokenized and cut
  into consecutive pieces of the 'targets' length (the last piece: the rest), so a row holds one file's
  contiguous tokens from a piece boundary on; files are never joined inside a piece, and no EOS is added (a piece
  boundary is not a document end). Rows of 2,048 are 2,048 consecutive tokens of one module.
* 'ptmjax_stdlib_module_summary': a long-input text-to-text task: inputs 'summarize: ' + a module's source with
  its docstring cut out, targets the docstring's first paragraph (`stdlib_sources.module_summary_and_body`), both
  with EOS; the inputs are cut to the 'inputs' length. Metrics 'rouge1', 'rouge2', 'rougeLsum'. 115 train and 16
  validation examples on CPython 3.11.

The splits are the sources' own (by a stable hash of the module name).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import seqio
import tensorflow as tf

from ptmjax import metrics
from ptmjax.data import corpus, stdlib_sources, vocabularies
from ptmjax.objectives import token_streams
from ptmjax.tasks import registry, text_to_text

LONG_LM_TASK = "ptmjax_stdlib_long_lm"
MODULE_SUMMARY_TASK = "ptmjax_stdlib_module_summary"


def sources_dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
    """seqio `FunctionDataSource` dataset_fn: {'text': a whole source file (tf.string)}, shuffled with `seed`
    (afresh on every repetition) when `shuffle_files`."""
    texts = [text for _, text in stdlib_sources.stdlib_sources(split)]
    dataset = tf.data.Dataset.from_tensor_slices({"text": texts})
    return dataset.shuffle(len(texts), seed=seed, reshuffle_each_iteration=True) if shuffle_files else dataset


def document_pieces(
    dataset: tf.data.Dataset, sequence_length: Mapping[str, int], output_features: Mapping[str, seqio.Feature]
) -> tf.data.Dataset:
    """{'targets': a document's tokens} -> {'targets': its consecutive pieces of the 'targets' length}."""
    del output_features  # the task's targets add no EOS
    return token_streams.split_token_stream(dataset, "targets", sequence_length["targets"])


@functools.cache
def module_summary_examples(split: str) -> tuple[tuple[str, str], ...]:
    """(source without its docstring, summary) of every module of one split that has a summary."""
    pairs = (stdlib_sources.module_summary_and_body(text) for _, text in stdlib_sources.stdlib_sources(split))
    return tuple((body, summary) for summary, body in filter(None, pairs))


def module_summary_dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
    """seqio `FunctionDataSource` dataset_fn: {'inputs': 'summarize: ' + source, 'targets': summary}."""
    examples = module_summary_examples(split)
    dataset = tf.data.Dataset.from_tensor_slices(
        {"inputs": [f"summarize: {body}" for body, _ in examples], "targets": [summary for _, summary in examples]})
    return dataset.shuffle(len(examples), seed=seed, reshuffle_each_iteration=True) if shuffle_files else dataset


def register_long_document_tasks(vocabulary: seqio.Vocabulary | None = None) -> None:
    """(Re-)registers the tasks of the module doc; vocabulary defaults to the stdlib SentencePiece one."""
    vocabulary = vocabulary or vocabularies.stdlib_sentencepiece_vocabulary()
    source = seqio.FunctionDataSource(sources_dataset_fn, splits=corpus.SPLITS)
    registry.register_task(LONG_LM_TASK, source, registry.objective_preprocessors(document_pieces, append_eos=False),
                           vocabulary, features={"targets": seqio.Feature(vocabulary, add_eos=False)})
    summaries = seqio.FunctionDataSource(module_summary_dataset_fn, splits=corpus.SPLITS)
    text_to_text.register(MODULE_SUMMARY_TASK, summaries, None, vocabulary, (metrics.rouge,))


register_long_document_tasks()
