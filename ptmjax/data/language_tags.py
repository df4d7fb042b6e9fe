"""mBART's language tags, as a seqio preprocessor for translation-style tasks.

mBART (Liu et al., 2020) marks each sequence with a language-code token, e.g.
`en_XX`, whose ids follow the SentencePiece pieces. The source ends with
`</s> <source code>`, and the decoder starts from the target's code. With
seqio's EncDecFeatureConverter (decoder inputs = targets shifted right after
id 0) this preprocessor gives

    inputs  = X </s> <source code>
    targets = <target code> Y          (+ </s> from append_eos_after_trim)

Place it after tokenisation and before
`seqio.preprocessors.append_eos_after_trim`, with an 'inputs' feature that
adds no EOS of its own (add_eos=False; checked).

Ids: `language_codes[i]` gets id `first_language_id + i`. By default the codes
follow the vocabulary (first_language_id = vocab_size), as mBART's 25 codes
follow its 250001 SentencePiece ids (en_XX = 250004, ro_RO = 250020); with
ptmjax's 2100-id stdlib vocabulary they are 2100..2124, inside bart_tiny's
2176 ids. The model's vocab_size must cover them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import gin
import seqio
import tensorflow as tf

# mBART-cc25's languages, in the order of their ids (fairseq's and Hugging Face's FAIRSEQ_LANGUAGE_CODES).
MBART_CC25_LANGUAGE_CODES = (
    "ar_AR", "cs_CZ", "de_DE", "en_XX", "es_XX", "et_EE", "fi_FI", "fr_XX", "gu_IN", "hi_IN", "it_IT", "ja_XX",
    "kk_KZ", "ko_KR", "lt_LT", "lv_LV", "my_MM", "ne_NP", "nl_XX", "ro_RO", "ru_RU", "si_LK", "tr_TR", "vi_VN",
    "zh_CN",
)
TAGS_IN_INPUTS = 2  # </s> and the source code


def language_id(code: str, first_language_id: int, language_codes: Sequence[str] = MBART_CC25_LANGUAGE_CODES) -> int:
    """The token id of language `code`; a ValueError lists the known codes."""
    if code not in language_codes:
        raise ValueError(f"unknown language code {code!r}; known: {list(language_codes)}.")
    return first_language_id + list(language_codes).index(code)


@seqio.map_over_dataset
def _add_tags(
    features: Mapping[str, tf.Tensor], source_tail: tuple[int, int], target_head: int, max_source: int | None
) -> dict[str, tf.Tensor]:
    inputs, targets = features["inputs"], features["targets"]
    if max_source is not None:
        inputs = inputs[:max_source]
    return {
        **features,
        "inputs": tf.concat([inputs, tf.constant(source_tail, inputs.dtype)], axis=0),
        "targets": tf.concat([tf.constant([target_head], targets.dtype), targets], axis=0),
    }


@gin.configurable
def add_language_tags(
    dataset: tf.data.Dataset,
    output_features: Mapping[str, seqio.Feature],
    source_language: str,
    target_language: str,
    sequence_length: Mapping[str, int] | None = None,
    language_codes: Sequence[str] = MBART_CC25_LANGUAGE_CODES,
    first_language_id: int | None = None,
) -> tf.data.Dataset:
    """{'inputs': X, 'targets': Y} -> {'inputs': X </s> <source_language>, 'targets': <target_language> Y}.

    Args:
      dataset: tokenised examples with int 'inputs' and 'targets'; other features pass through.
      output_features: seqio features; 'inputs' gives the EOS id and must have add_eos=False.
      source_language / target_language: codes from `language_codes`, e.g. 'en_XX', 'ro_RO'.
      sequence_length: when it gives 'inputs', X is cut to that length less 2, so the tags always fit.
      language_codes: the codes in id order (mBART-cc25's by default).
      first_language_id: the id of language_codes[0]; None = the 'inputs' vocabulary's vocab_size.
    """
    feature = output_features["inputs"]
    if feature.add_eos:
        raise ValueError(
            "add_language_tags ends 'inputs' with </s> <code> itself; build the 'inputs' feature with add_eos=False "
            "so that no second EOS follows the code."
        )
    vocabulary = feature.vocabulary
    first = vocabulary.vocab_size if first_language_id is None else first_language_id
    max_source = None
    if sequence_length and sequence_length.get("inputs") is not None:
        max_source = int(sequence_length["inputs"]) - TAGS_IN_INPUTS
        if max_source < 1:
            raise ValueError(
                f"sequence_length['inputs']={sequence_length['inputs']} leaves no room for a source token and the "
                f"{TAGS_IN_INPUTS} tags; use at least {TAGS_IN_INPUTS + 1}."
            )
    source_tail = (vocabulary.eos_id, language_id(source_language, first, language_codes))
    target_head = language_id(target_language, first, language_codes)
    return _add_tags(dataset, source_tail=source_tail, target_head=target_head, max_source=max_source)
