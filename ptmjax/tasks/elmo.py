"""ELMo's pre-training task over the embedded stdlib corpus; importing this module registers it:

* 'ptmjax_stdlib_elmo': each document's words (`WordVocabulary`, ptmjax/data/word_vocabulary.py) then EOS, cut
  into rows of at most `task_feature_lengths['targets']` words: 'targets' (word ids) and 'target_chars' (each
  word's character ids, [n, max_characters]; a word outside the vocabulary keeps its own characters). For
  `ptmjax.models.Elmo` (`gin_configs/runs/elmo_demo.gin`), batched by `BidirectionalLmFeatureConverter`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import seqio
import tensorflow as tf

from ptmjax.data import corpus
from ptmjax.data.word_vocabulary import EOS_ID, WordVocabulary, numpy_text
from ptmjax.tasks import registry

ELMO_TASK = "ptmjax_stdlib_elmo"


def word_rows(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
              output_features: Mapping[str, seqio.Feature]) -> tf.data.Dataset:
    """'text' -> rows of 'targets' [<= n] and 'target_chars' [<= n, max_characters], n = sequence_length['targets']
    (the text's words then EOS, in consecutive rows)."""
    vocabulary: WordVocabulary = output_features["targets"].vocabulary
    length, width = sequence_length["targets"], vocabulary.max_characters
    eos_chars = vocabulary.character_table[EOS_ID]

    def encode(text: bytes) -> tuple[np.ndarray, np.ndarray]:
        ids, chars = vocabulary.encode_with_characters(numpy_text(text))
        return np.append(ids, EOS_ID).astype(np.int32), np.concatenate([chars, eos_chars[None]]).astype(np.int32)

    def rows(features: Mapping[str, tf.Tensor]) -> tf.data.Dataset:
        ids, chars = tf.numpy_function(encode, [features["text"]], (tf.int32, tf.int32))
        ids, chars = tf.ensure_shape(ids, [None]), tf.ensure_shape(chars, [None, width])
        starts = tf.range(0, tf.shape(ids)[0], length)
        return tf.data.Dataset.from_tensor_slices(starts).map(
            lambda start: {"targets": ids[start : start + length], "target_chars": chars[start : start + length]})

    return dataset.flat_map(rows)


def register_elmo_task(vocabulary: WordVocabulary | None = None) -> seqio.Task:
    """(Re-)registers 'ptmjax_stdlib_elmo' (vocabulary: `WordVocabulary()`, 4000 ids, 16 characters a word)."""
    source = seqio.FunctionDataSource(corpus.stdlib_dataset_fn, splits=corpus.SPLITS)
    vocabulary = vocabulary or WordVocabulary()
    return registry.register_task(ELMO_TASK, source, [word_rows], vocabulary,
                                  features={"targets": seqio.Feature(vocabulary, add_eos=True)})


register_elmo_task()
