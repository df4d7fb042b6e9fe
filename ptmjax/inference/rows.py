"""Token ids -> model rows: through the family's seqio feature converter (unpacked), or as plain
continuations for causal language models converted from Hugging Face.

- Encoder-decoders (T5, BART): `EncDecFeatureConverter` rows; decoding reads 'encoder_input_tokens'.
- Decoder-only models trained by ptmjax: seqio's PrefixLM rows (`DecoderFeatureConverter` of
  inputs and targets) as they are; decoding reads the prompt where 'decoder_causal_attention' is 1
  (the inputs after the converter's leading 0), bidirectionally (decoding/prefill.py).
- Decoder-only models from Hugging Face (GPT-2), and a family whose converter's rows hold no prompt
  (`Family.causal_prompts`: Transformer-XL), `RowFormat.causal`: the prompt's ids as they are,
  right-padded, read causally, as `transformers`' generate reads them; scored rows are the prompt
  and target as one stream shifted by one.

Predict rows need a target for the converter to emit the prompt: a lone EOS, which no decoding field reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import seqio
import tensorflow as tf

from ptmjax.families.family import Family

Rows = dict[str, np.ndarray]
PREDICT_FIELDS = ("encoder_input_tokens", "decoder_input_tokens", "decoder_causal_attention", "decoder_segment_ids")


@dataclasses.dataclass(frozen=True)
class RowFormat:
    """How a model reads token ids: its family, whether a decoder-only model reads plain causal rows
    (`causal`), and the special tokens text is encoded with (`bos_id` before, EOS after if `add_eos`).
    An encoder-decoder's scored rows start the decoder from `decoder_start_id` (seqio's converter: 0; BART: 2)."""

    family: Family
    eos_id: int
    bos_id: int | None = None
    add_eos: bool = True
    causal: bool = False
    decoder_start_id: int = 0

    def __post_init__(self) -> None:
        if self.causal and not self.family.decoder_only:
            raise ValueError("RowFormat.causal=True is for decoder-only models; set it False for an encoder-decoder")

    def predict_rows(self, inputs: Sequence[Sequence[int]], length: int) -> Rows:
        """Rows [n, ...] of the prompts `inputs` (ids with their special tokens), each at most `length` ids."""
        if self.causal:
            return {"decoder_input_tokens": _right_padded(inputs, length),
                    "decoder_segment_ids": _right_padded([[1] * len(x) for x in inputs], length)}
        rows = self._converted(inputs, [[self.eos_id]] * len(inputs), length, 1)
        return {name: value for name, value in rows.items() if name in PREDICT_FIELDS}

    def score_rows(
        self, inputs: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], input_length: int, target_length: int
    ) -> Rows:
        """Rows [n, ...] whose targets (weighted by the family's loss weights) are `targets` after `inputs`."""
        if not self.causal:
            rows = self._converted(inputs, targets, input_length, target_length)
            if "encoder_input_tokens" in rows:
                rows["decoder_input_tokens"] = np.array(rows["decoder_input_tokens"])
                rows["decoder_input_tokens"][:, 0] = self.decoder_start_id
                # seqio weighs targets != 0; a target's id 0 (Hugging Face BART's leading <s>) is scored too
                rows["decoder_loss_weights"] = _right_padded([[1] * len(y[:target_length]) for y in targets],
                                                             target_length)
            return rows
        streams = [[*x, *y] for x, y in zip(inputs, targets, strict=True)]
        length = input_length + target_length - 1
        weights = [[0] * (len(x) - 1) + [1] * len(y) for x, y in zip(inputs, targets, strict=True)]
        return {
            "decoder_input_tokens": _right_padded([s[:-1] for s in streams], length),
            "decoder_target_tokens": _right_padded([s[1:] for s in streams], length),
            "decoder_loss_weights": _right_padded(weights, length),
        }

    def _converted(
        self, inputs: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], input_length: int, target_length: int
    ) -> Rows:
        def examples():
            for x, y in zip(inputs, targets, strict=True):
                yield {"inputs": np.asarray(x, np.int32), "targets": np.asarray(y, np.int32)}

        spec = tf.TensorSpec([None], tf.int32)
        dataset = tf.data.Dataset.from_generator(examples, output_signature={"inputs": spec, "targets": spec})
        converter: seqio.FeatureConverter = self.family.feature_converter(pack=False)
        converted = converter(dataset, {"inputs": input_length, "targets": target_length})
        return next(converted.batch(len(inputs)).as_numpy_iterator())


def _right_padded(rows: Sequence[Sequence[int]], length: int) -> np.ndarray:
    array = np.zeros((len(rows), length), np.int32)
    for i, row in enumerate(rows):
        array[i, : len(row)] = row
    return array
