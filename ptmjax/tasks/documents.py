"""Whole documents of the embedded corpus, for models whose rows continue each other (Transformer-XL).

Importing this module registers, with the stdlib SentencePiece vocabulary:

* 'ptmjax_stdlib_documents': 'targets' each document of the corpus, tokenised whole with EOS after it, in
  the corpus' splits ('train', 'validation'). task_feature_lengths['targets'] bounds a document (longer
  ones are trimmed); `SegmentStreamFeatureConverter` (ptmjax/data/segment_stream_converter.py) cuts
  the documents into the rows a model reads.
"""

from __future__ import annotations

import seqio
import tensorflow as tf

from ptmjax.data import corpus, vocabularies
from ptmjax.tasks import registry

STDLIB_DOCUMENTS_TASK = "ptmjax_stdlib_documents"


def whole_documents(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The objective of a document stream: each tokenised document as it is."""
    return dataset


def register_documents_task(
    name: str = STDLIB_DOCUMENTS_TASK, vocabulary: seqio.Vocabulary | None = None
) -> seqio.Task:
    """Registers (or replaces) the whole-documents task over the embedded corpus."""
    source = seqio.FunctionDataSource(corpus.stdlib_dataset_fn, splits=corpus.SPLITS)
    return registry.register_task(name, source, registry.objective_preprocessors(whole_documents),
                                  vocabulary or vocabularies.stdlib_sentencepiece_vocabulary())


register_documents_task()
