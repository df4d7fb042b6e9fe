"""Token tagging over the embedded stdlib corpus: the code identifiers and literals in docstring prose.

Importing this module registers, with the stdlib SentencePiece vocabulary, 'ptmjax_stdlib_code_tagging':
one example per docstring paragraph (`docstring_paragraphs`: 3,228 train and 362 validation on
CPython 3.11), its words tagged by `code_spans` with the BIO tags `TAGS` = O, B-IDENT, I-IDENT,
B-LIT, I-LIT (ids 0-4). Features:

* 'inputs' [n] int32: the words' ids (`word_tokens.encode_words`) in the vocabulary's template for one
  text (`head_inputs.templated`): then EOS; with an imported tokenizer, its special tokens around them
  (`[CLS] ... [SEP]`), as transformers' `tokenizer(" ".join(words))` gives them;
* 'tags' [n] int32: each word's tag id on its first id, -1 on its other ids and on the special ids;
* 'words' [w] string: the words whose tags are in the example (for reading).

With a sequence length for 'inputs' (L), a longer example keeps its first ids and the template's closing
special ids (EOS, [SEP]) within L, and the words whose first id it kept (a cut word's tag stays on its first
id), as transformers' truncation to max_length L. The vocabulary may be any seqio vocabulary with an EOS id
or a template; what a word's first id is for each kind is said in `word_tokens`.

Words (scored tokens) on CPython 3.11, train / validation: 72,067 / 8,553; tags O 90.3 / 91.1%,
B-IDENT 4.8 / 4.7%, I-IDENT 1.3 / 1.1%, B-LIT 3.1 / 2.6%, I-LIT 0.4 / 0.5%. Chance level
(`all_outside_baseline`: every word O) on validation: token accuracy 91.07, span F1 0. With the
stdlib SentencePiece vocabulary an example has 29 ids at the median, 546 at most; 125 of the 3,590
are longer than 128 ids, 21 longer than 256.

Metric: `metrics.token_tagging(TAGS)`: 'token_accuracy' and 'span_f1' (with span precision and recall),
0-100. Its targets are examples' 'tags' (the postprocessor takes them from the example), its
predictions a tag id per position of 'inputs' (a model's argmax); only positions whose tag is not -1
are scored, so a padded batch must pad 'tags' with -1.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import seqio
import tensorflow as tf

from ptmjax import metrics
from ptmjax.data import code_spans, corpus, docstring_paragraphs, vocabularies, word_tokens
from ptmjax.tasks import head_inputs, registry

TAGGING_TASK = "ptmjax_stdlib_code_tagging"
TAGS = code_spans.TAGS
UNSCORED = -1


@functools.cache
def word_tags(split: str) -> tuple[tuple[tuple[str, ...], tuple[int, ...]], ...]:
    """(words, each word's tag id) of every paragraph of one split."""
    examples = []
    for module, words in docstring_paragraphs.docstring_paragraphs(split):
        spans = code_spans.code_spans(words, module)
        examples.append((words, tuple(code_spans.bio_tags(len(words), spans))))
    return tuple(examples)


def tagging_features(words: tuple[str, ...], tags: tuple[int, ...], vocabulary: seqio.Vocabulary) -> dict:
    """The untruncated features of one example (see the module doc)."""
    ids, starts = word_tokens.encode_words(vocabulary, words)
    placed = head_inputs.templated(head_inputs.template(vocabulary, False, TAGGING_TASK), [ids])
    token_tags = np.full(len(placed.ids), UNSCORED, np.int32)
    token_tags[placed.starts[0] + np.asarray(starts, np.int64)] = tags
    return {"inputs": placed.ids, "tags": token_tags, "words": np.asarray(words, object)}


def tagging_dataset_fn(
    split: str, shuffle_files: bool, seed: int | None = None, *, vocabulary: seqio.Vocabulary
) -> tf.data.Dataset:
    """seqio `FunctionDataSource` dataset_fn of the features of the module doc, untruncated."""
    examples = [tagging_features(words, tags, vocabulary) for words, tags in word_tags(split)]
    dataset = tf.data.Dataset.from_generator(
        lambda: iter(examples),
        output_signature={"inputs": tf.TensorSpec([None], tf.int32), "tags": tf.TensorSpec([None], tf.int32),
                          "words": tf.TensorSpec([None], tf.string)},
    )
    if shuffle_files:
        dataset = dataset.shuffle(len(examples), seed=seed, reshuffle_each_iteration=True)
    return dataset


def truncate_tagging(
    dataset: tf.data.Dataset, sequence_length: Mapping[str, int] | None, suffix: int = 1
) -> tf.data.Dataset:
    """Cuts examples longer than sequence_length['inputs'] as the module doc says, keeping the `suffix` closing
    special ids (no length: unchanged)."""
    length = (sequence_length or {}).get("inputs")
    if length is None:
        return dataset

    def truncate(features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        cut = head_inputs.cut_keeping_suffix(features, ("inputs", "tags"), length, suffix)
        num_words = tf.reduce_sum(tf.cast(cut["tags"] != UNSCORED, tf.int32))
        return {**cut, "words": features["words"][:num_words]}

    return dataset.map(truncate, num_parallel_calls=tf.data.AUTOTUNE)


def tags_postprocessor(output: Any, example: Mapping[str, Any] | None = None, is_target: bool = False) -> Any:
    """A target: the example's 'tags'; a prediction (tag ids per position) as it is."""
    return np.asarray(example["tags"]) if is_target else output


def all_outside_baseline(split: str = "validation") -> dict[str, float]:
    """The metrics of tagging every word O on `split`: the chance level."""
    examples = word_tags(split)
    return metrics.token_tagging(TAGS)([tags for _, tags in examples], [[0] * len(tags) for _, tags in examples])


def register_tagging_task(vocabulary: seqio.Vocabulary | None = None) -> seqio.Task:
    """(Re-)registers the task of the module doc; vocabulary defaults to the stdlib SentencePiece one (an
    imported model's: `register_tagging_task.vocabulary = @folder_vocabulary()`)."""
    vocabulary = vocabulary or vocabularies.stdlib_sentencepiece_vocabulary()
    source = seqio.FunctionDataSource(
        functools.partial(tagging_dataset_fn, vocabulary=vocabulary), splits=corpus.SPLITS
    )
    suffix = head_inputs.suffix_length(head_inputs.template(vocabulary, False, TAGGING_TASK))
    features = {"inputs": seqio.Feature(vocabulary, add_eos=True),
                "tags": seqio.Feature(seqio.PassThroughVocabulary(len(TAGS)), add_eos=False)}
    truncate = functools.partial(truncate_tagging, suffix=suffix)
    return registry.register_task(TAGGING_TASK, source, [truncate], vocabulary, [metrics.token_tagging(TAGS)],
                                  tags_postprocessor, features)


register_tagging_task()
