"""The built-in pre-training tasks and mixtures; importing this module registers:

* 'ptmjax_stdlib_span_corruption': T5 span corruption over the embedded stdlib
  corpus (splits 'train', 'validation'), SentencePiece vocabulary trained on
  first use (2000 pieces + 100 sentinels = 2100 ids).
* 'ptmjax_stdlib_span_corruption_byte': the same with `seqio.ByteVocabulary`
  (259 + 100 sentinels = 359 ids); nothing to train.
* 'ptmjax_pretrain' / 'ptmjax_pretrain_byte': the default pre-training mixtures.
* 'ptmjax_stdlib_causal_lm': causal language modeling over the embedded corpus
  ('targets' only: `objectives.language_modeling.causal_lm`), for decoder-only
  models such as GPT-2.
* 'ptmjax_stdlib_mlm': BERT masked LM (15%, 80/10/10) over the embedded
  corpus, for encoder-only models without a sentence-pair head (RoBERTa,
  ELECTRA): 'inputs', 'targets', 'loss_mask'.
* 'ptmjax_stdlib_mlm_nsp' / 'ptmjax_stdlib_mlm_sop': sentence pairs with
  next-sentence (BERT) or sentence-order (ALBERT) labels, plus masked LM
  (`objectives.sentence_pairs`).
* 'ptmjax_stdlib_permuted_lm': XLNet's permuted LM (`objectives.permuted_lm`):
  'inputs', 'targets', 'loss_mask', 'permutation_rank'.
* 'ptmjax_stdlib_masked_permuted_lm': MPNet's masked and permuted LM
  (`objectives.masked_permuted_lm`): 'inputs', 'positions' (the content
  stream), 'targets', 'loss_mask' (one per prediction).
* 'ptmjax_stdlib_blank_infilling': GLM's blank infilling (`objectives.blank_infilling`):
  part A with [MASK]s, part B the shuffled spans, 2D positions; rows of the 'targets' length.
* 'ptmjax_c4_span_corruption': span corruption over TFDS 'c4/en:3.1.0', for
  users who have prepared C4 in their TFDS data dir (nothing is read or
  downloaded when it is registered).

Registering a name again replaces the old entry, so re-imports and notebooks
do not crash. More tasks and mixtures are a few lines each::

    from ptmjax.tasks import pretraining, registry
    pretraining.register_text_files_task(
        "my_books", train_pattern="/data/books/train-*.txt",
        validation_pattern="/data/books/valid.txt")
    registry.register_mixture("my_pretrain", [("ptmjax_stdlib_span_corruption", 1.0), ("my_books", 3.0)])
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import seqio
import tensorflow as tf

from ptmjax.data import corpus, document_pieces, text_files, vocabularies
from ptmjax.objectives import (
    blank_infilling,
    language_modeling,
    masked_lm,
    masked_permuted_lm,
    permuted_lm,
    sentence_pairs,
    span_corruption,
)
from ptmjax.tasks import registry

STDLIB_TASK = "ptmjax_stdlib_span_corruption"
STDLIB_LM_TASK = "ptmjax_stdlib_causal_lm"
STDLIB_MLM_TASK = "ptmjax_stdlib_mlm"
STDLIB_NSP_TASK = "ptmjax_stdlib_mlm_nsp"
STDLIB_SOP_TASK = "ptmjax_stdlib_mlm_sop"
STDLIB_PERMUTED_LM_TASK = "ptmjax_stdlib_permuted_lm"
STDLIB_MASKED_PERMUTED_LM_TASK = "ptmjax_stdlib_masked_permuted_lm"
STDLIB_BLANK_INFILLING_TASK = "ptmjax_stdlib_blank_infilling"
STDLIB_BYTE_TASK = "ptmjax_stdlib_span_corruption_byte"
C4_TASK = "ptmjax_c4_span_corruption"
PRETRAIN_MIXTURE = "ptmjax_pretrain"
PRETRAIN_BYTE_MIXTURE = "ptmjax_pretrain_byte"


def span_corruption_preprocessors(text_key: str = "text") -> list[Callable]:
    """T5 span corruption over the text feature `text_key`."""
    return registry.objective_preprocessors(span_corruption.span_corruption, text_key)


def register_stdlib_task(name: str, vocabulary: seqio.Vocabulary) -> seqio.Task:
    """Span corruption over the embedded stdlib corpus with `vocabulary`."""
    source = seqio.FunctionDataSource(corpus.stdlib_dataset_fn, splits=corpus.SPLITS)
    return registry.register_task(name, source, span_corruption_preprocessors("text"), vocabulary)


@seqio.map_over_dataset
def _document_to_text(document: tf.Tensor) -> dict[str, tf.Tensor]:
    return {"text": document}


def register_text_files_task(
    name: str,
    train_pattern: str | Sequence[str],
    validation_pattern: str | Sequence[str] | None = None,
    vocabulary: seqio.Vocabulary | None = None,
    max_document_bytes: int = document_pieces.DEFAULT_MAX_DOCUMENT_BYTES,
) -> seqio.Task:
    """Span corruption over local text files, one document per line.

    The files are checked before the first step (`text_files.TextFilesSource`: empty
    or binary files are refused, invalid UTF-8 is counted in a warning).

    Args:
      name: the task name.
      train_pattern: glob(s) of the 'train' split's files.
      validation_pattern: glob(s) of the 'validation' split (optional).
      vocabulary: defaults to `vocabularies.default_vocabulary()`.
      max_document_bytes: longer lines are cut into documents of at most this
        many bytes before tokenising, so memory does not grow with line length.
    """
    splits = {"train": train_pattern}
    if validation_pattern is not None:
        splits["validation"] = validation_pattern
    source = text_files.TextFilesSource(splits, max_document_bytes)
    preprocessors = [_document_to_text, *span_corruption_preprocessors("text")]
    return registry.register_task(name, source, preprocessors, vocabulary or vocabularies.default_vocabulary())


def register_c4_task(
    name: str = C4_TASK,
    vocabulary: seqio.Vocabulary | None = None,
    tfds_name: str = "c4/en:3.1.0",
    tfds_data_dir: str | None = None,
) -> seqio.Task:
    """Span corruption over TFDS C4 ('train', 'validation'); needs prepared data to run."""
    source = seqio.TfdsDataSource(tfds_name=tfds_name, tfds_data_dir=tfds_data_dir, splits=("train", "validation"))
    return registry.register_task(
        name, source, span_corruption_preprocessors("text"), vocabulary or vocabularies.default_vocabulary()
    )


def register_defaults() -> None:
    """(Re-)registers the built-in tasks and mixtures listed in the module doc."""
    sentencepiece = vocabularies.stdlib_sentencepiece_vocabulary()
    register_stdlib_task(STDLIB_TASK, sentencepiece)
    register_stdlib_task(STDLIB_BYTE_TASK, vocabularies.byte_vocabulary())
    register_c4_task(C4_TASK, sentencepiece)
    stdlib_source = seqio.FunctionDataSource(corpus.stdlib_dataset_fn, splits=corpus.SPLITS)
    preprocessors = registry.objective_preprocessors
    registry.register_task(STDLIB_LM_TASK, stdlib_source, preprocessors(language_modeling.causal_lm), sentencepiece)
    # Encoder-only objectives: they place their own EOS / [SEP].
    registry.register_task(STDLIB_MLM_TASK, stdlib_source, preprocessors(masked_lm.bert_mlm, append_eos=False),
                           sentencepiece)
    registry.register_task(STDLIB_PERMUTED_LM_TASK, stdlib_source,
                           preprocessors(permuted_lm.permuted_lm, append_eos=False), sentencepiece)
    registry.register_task(STDLIB_MASKED_PERMUTED_LM_TASK, stdlib_source,
                           preprocessors(masked_permuted_lm.masked_permuted_lm, append_eos=False), sentencepiece)
    registry.register_task(STDLIB_BLANK_INFILLING_TASK, stdlib_source,
                           preprocessors(blank_infilling.blank_infilling, append_eos=False), sentencepiece)
    for task, kind in ((STDLIB_NSP_TASK, "nsp"), (STDLIB_SOP_TASK, "sop")):
        pairs = functools.partial(sentence_pairs.sentence_pair_mlm, kind=kind)
        registry.register_task(task, stdlib_source, preprocessors(pairs, append_eos=False), sentencepiece)
    registry.register_mixture(PRETRAIN_MIXTURE, [(STDLIB_TASK, 1.0)])
    registry.register_mixture(PRETRAIN_BYTE_MIXTURE, [(STDLIB_BYTE_TASK, 1.0)])


register_defaults()
