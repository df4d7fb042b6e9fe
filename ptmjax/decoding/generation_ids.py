"""The token ids generation starts, pads and stops with: read from Hugging Face, kept in `generation.json`.

An import records config.json's ids, overridden by generation_config.json's,
and their beam-search length penalty; an export writes them into both files. A ptmjax-trained run has no
generation.json: its ids follow its vocabulary (T5's convention: the decoder
of an encoder-decoder starts from the pad id).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import seqio

GENERATION_FILE = "generation.json"
HF_LENGTH_PENALTY = 1.0  # transformers' GenerationConfig default


@dataclasses.dataclass(frozen=True)
class GenerationIds:
    """Generation's special token ids; None where the family has none.

    eos_token_id: ends a sequence (decoding needs it); pad_token_id fills the slots after it
      (decoding uses EOS where it is None, as Hugging Face does for GPT-2).
    decoder_start_token_id: the first decoder input (encoder-decoders; T5: 0, BART: 2,
      mBART-cc25: the target language tag).
    bos_token_id: what a decoder-only prompt may start with (GPT-2's <|endoftext|>).
    forced_bos_token_id: the token forced after the decoder start (mBART-50's language tag).
    forced_eos_token_id: the token forced at the length limit (BART).
    length_penalty: not an id: Hugging Face's beam-search length penalty exponent, set for models from Hugging
      Face (1.0 where their files leave it out), so that beam search ranks as their `generate` does (see
      DecodeConfig.length_penalty_style); None for models trained here.
    """

    eos_token_id: int | None = None
    pad_token_id: int | None = None
    decoder_start_token_id: int | None = None
    bos_token_id: int | None = None
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | None = None
    length_penalty: float | None = None

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str) -> GenerationIds:
        """The fields `values` holds (others ignored); a non-integer id raises naming `source`."""
        ids = {f.name: values.get(f.name) for f in dataclasses.fields(cls)}
        penalty = ids.pop("length_penalty")
        for name, value in ids.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{source} has {name}={value!r}; ptmjax records one integer id (or null) per field")
        if penalty is not None and (isinstance(penalty, bool) or not isinstance(penalty, (int, float))):
            raise ValueError(f"{source} has length_penalty={penalty!r}; it must be a number (or null)")
        return cls(**ids, length_penalty=None if penalty is None else float(penalty))

    @classmethod
    def from_hf_dir(cls, path: str) -> GenerationIds:
        """config.json's ids, overridden by generation_config.json's non-null ones, and their length penalty."""
        values: dict[str, Any] = {"length_penalty": HF_LENGTH_PENALTY}
        for name in ("config.json", "generation_config.json"):
            file = os.path.join(path, name)
            if os.path.isfile(file):
                values.update({k: v for k, v in _read_json(file).items() if v is not None})
        return cls.from_dict(values, os.path.join(path, "config.json"))

    @classmethod
    def from_vocabulary(cls, vocabulary: seqio.Vocabulary, encoder_decoder: bool) -> GenerationIds:
        """The ids of a model trained on `vocabulary`; an encoder-decoder's decoder starts from pad (T5)."""
        try:
            bos = vocabulary.bos_id
        except NotImplementedError:  # seqio's base class has no BOS
            bos = None
        return cls(
            eos_token_id=vocabulary.eos_id,
            pad_token_id=vocabulary.pad_id,
            decoder_start_token_id=vocabulary.pad_id if encoder_decoder else None,
            bos_token_id=bos if bos is not None and bos >= 0 else None,  # SentencePiece says -1 for none
        )

    @classmethod
    def read(cls, path: str) -> GenerationIds:
        """From a generation.json."""
        return cls.from_dict(_read_json(path), path)

    def write(self, path: str) -> None:
        """As a generation.json."""
        with open(path, "w") as f:
            json.dump(dataclasses.asdict(self), f, indent=2)
            f.write("\n")

    def for_decoding(self) -> GenerationIds:
        """These ids with pad defaulting to EOS; raises without EOS, which decoding needs."""
        if self.eos_token_id is None:
            raise ValueError("GenerationIds.eos_token_id is None; decoding needs the id that ends a sequence")
        pad = self.eos_token_id if self.pad_token_id is None else self.pad_token_id
        return dataclasses.replace(self, pad_token_id=pad)

    def to_hf(self) -> dict[str, int | float]:
        """The fields that are set, as transformers' config and GenerationConfig fields."""
        return {name: value for name, value in dataclasses.asdict(self).items() if value is not None}


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error.msg} at line {error.lineno}); rewrite it") from None
