"""How a head task reads its 'inputs' text: as the model's tokenizer encodes one text.

An imported Hugging Face tokenizer whose post-processor puts special tokens around a text (BERT's
`[CLS] text [SEP]`, RoBERTa's `<s> text </s>`) gives exactly what transformers' `tokenizer(text,
truncation=True, max_length=L)` gives: the text cut so that the whole fits the 'inputs' length, the special
tokens kept, so that a head pooling the first position pools `[CLS]` as the model was pre-trained to. Any
other vocabulary (ptmjax's SentencePiece, GPT-2's byte-level BPE, which adds nothing) gives the text's ids
cut to one less than the length, then EOS (seqio's `tokenize` and `append_eos_after_trim`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import seqio
import tensorflow as tf

from ptmjax.data.hf_tokenizer_vocabulary import HfTokenizerVocabulary


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
