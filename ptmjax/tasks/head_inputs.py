"""How a head task reads its 'inputs': as the model's tokenizer encodes one text, a pair, or a text's words.

An imported Hugging Face tokenizer whose post-processor puts special tokens around a text (BERT's
`[CLS] text [SEP]`, RoBERTa's `<s> text </s>`) gives exactly what transformers' `tokenizer(text,
truncation=True, max_length=L)` gives: the text cut so that the whole fits the 'inputs' length, the special
tokens kept, so that a head pooling the first position pools `[CLS]` as the model was pre-trained to. Any
other vocabulary (ptmjax's SentencePiece, GPT-2's byte-level BPE, which adds nothing) gives the text's ids
cut to one less than the length, then EOS (seqio's `tokenize` and `append_eos_after_trim`).

Word-level tasks (tagging, extractive QA) encode word by word and place the ids with `templated`: an imported
tokenizer's template for one text or a pair (`[CLS] question [SEP] context [SEP]`, `<s> question </s></s>
context </s>`), with its token types, as transformers' `tokenizer(question, context)` gives them; any other
vocabulary's template is each text followed by EOS, token type 0 for the first text, 1 for the second. A
longer example is cut by `cut_keeping_suffix`: its first ids, then the special ids that close the template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import seqio
import tensorflow as tf

from ptmjax.data import word_tokens
from ptmjax.data.hf_tokenizer_vocabulary import HfTokenizerVocabulary, TemplatePiece


def adds_special_tokens(vocabulary: seqio.Vocabulary) -> bool:
    """Whether `vocabulary` is a Hugging Face tokenizer whose template puts tokens around a text."""
    return isinstance(vocabulary, HfTokenizerVocabulary) and bool(vocabulary.encode_with_template(""))


def tokenize_as_one_text(
    dataset: tf.data.Dataset, output_features: Mapping[str, seqio.Feature], sequence_length: Mapping[str, int] | None,
    keys: tuple[str, ...] = ("inputs",),
) -> tf.data.Dataset:
    """seqio preprocessor: each of the `keys` texts ('inputs'; a pair task's 'targets' too) -> int32 ids as the
    module doc says, cut to its own length; each text stays as '<key>_pretokenized'."""
    vocabulary = output_features["inputs"].vocabulary
    if not adds_special_tokens(vocabulary):
        dataset = seqio.preprocessors.tokenize(dataset, output_features)
        return seqio.preprocessors.append_eos_after_trim(dataset, output_features, sequence_length)

    def encoder(key: str):
        max_length = sequence_length[key] if sequence_length else None
        return lambda text: np.asarray(vocabulary.encode_with_template(text.decode("utf-8"), max_length), np.int32)

    encoders = {key: encoder(key) for key in keys}

    def with_ids(example: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        out = dict(example)
        for key, encode in encoders.items():
            out[key] = tf.numpy_function(encode, [example[key]], tf.int32, stateful=False)
            out[key].set_shape([None])
            out[f"{key}_pretokenized"] = example[key]
        return out

    return dataset.map(with_ids, num_parallel_calls=tf.data.AUTOTUNE)


class Templated(NamedTuple):
    """Texts placed in a template: the ids, their token types, and the index of each text's first id."""

    ids: np.ndarray
    type_ids: np.ndarray
    starts: tuple[int, ...]


def template(vocabulary: seqio.Vocabulary, pair: bool, task: str) -> tuple[TemplatePiece, ...]:
    """The template `task` places its texts in (see the module doc)."""
    if adds_special_tokens(vocabulary):
        return vocabulary.template(pair)
    eos = word_tokens.require_eos(vocabulary, task)
    return tuple(TemplatePiece(special, text) for text in range(1 + pair) for special in (None, eos))


def templated(pieces: Sequence[TemplatePiece], texts: Sequence[Sequence[int]]) -> Templated:
    """The ids of `texts` (one per text place of `pieces`) with the template's special ids around them."""
    ids, type_ids, starts = [], [], []
    remaining = iter(texts)
    for piece in pieces:
        part = [piece.special_id] if piece.special_id is not None else list(next(remaining))
        if piece.special_id is None:
            starts.append(len(ids))
        ids.extend(part)
        type_ids.extend([piece.type_id] * len(part))
    return Templated(np.asarray(ids, np.int32), np.asarray(type_ids, np.int32), tuple(starts))


def suffix_length(pieces: Sequence[TemplatePiece]) -> int:
    """How many special ids close the template (after its last text)."""
    last_text = max(i for i, piece in enumerate(pieces) if piece.special_id is None)
    return len(pieces) - 1 - last_text


def cut_keeping_suffix(
    features: Mapping[str, tf.Tensor], keys: Sequence[str], length: int, suffix: int
) -> dict[str, tf.Tensor]:
    """The `keys` sequences of an example longer than `length` cut to their first `length - suffix` entries
    followed by their last `suffix` (the template's closing special ids); a shorter example unchanged."""
    kept = tf.minimum(tf.size(features[keys[0]]) - suffix, length - suffix)
    return {key: tf.concat([features[key][:kept], features[key][tf.size(features[key]) - suffix :]], 0)
            for key in keys}
