"""How to decode: the algorithm and its settings, and what a decode returns."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import gin
import jax

from ptmjax.decoding.generation_ids import HF_LENGTH_PENALTY, GenerationIds

METHODS = ("greedy", "beam", "sample")
LENGTH_PENALTY_STYLES = ("t5", "hf")
T5_LENGTH_PENALTY_ALPHA = 0.6  # T5's beam search


@gin.configurable
@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """How `ModelApi.predict` decodes.

    method: 'greedy', 'beam' (beam search) or 'sample' (temperature, top-k, top-p).
    max_decode_length: the most tokens generated per sequence, EOS included.
    num_beams: the beam width (method='beam').
    length_penalty_style: how a finished beam's sum(log p) is divided (decoding/beam_search.py): 't5'
      by ((5 + length) / 6) ** alpha (GNMT, T5), 'hf' by length ** alpha as Hugging Face's `generate`;
      None: the model's origin, 'hf' for a Hugging Face model or an import (its generation ids carry a
      `length_penalty`), else 't5'.
    length_penalty_alpha: the exponent; None: 0.6 for 't5' (T5's), the origin's `length_penalty` for 'hf'
      (transformers' default 1.0). 0 ranks by the plain sum of log-probabilities.
    temperature, top_k (0 = off), top_p (1.0 = off): method='sample' draws from
      softmax(logits / temperature) restricted to the top_k tokens and to the smallest set whose
      probabilities sum to top_p.
    num_decodes: sequences returned per input: samples drawn (method='sample'), or the best
      beams (method='beam', at most num_beams).
    """

    method: str = "greedy"
    max_decode_length: int = 64
    num_beams: int = 4
    length_penalty_style: str | None = None
    length_penalty_alpha: float | None = None
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    num_decodes: int = 1

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"DecodeConfig.method={self.method!r} is unknown; use one of {', '.join(METHODS)}.")
        for name in ("max_decode_length", "num_beams", "num_decodes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"DecodeConfig.{name} must be a positive int, got {value!r}.")
        if self.method == "beam" and self.num_decodes > self.num_beams:
            raise ValueError(
                f"DecodeConfig.num_decodes={self.num_decodes} exceeds num_beams={self.num_beams}; beam search "
                "returns at most num_beams sequences."
            )
        if self.method == "greedy" and self.num_decodes != 1:
            raise ValueError(
                f"DecodeConfig.num_decodes={self.num_decodes} with method='greedy' would repeat one sequence; "
                "use method='sample' or 'beam' for several."
            )
        if self.temperature <= 0:
            raise ValueError(
                f"DecodeConfig.temperature must be > 0, got {self.temperature!r}; method='greedy' takes the argmax."
            )
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"DecodeConfig.top_k must be an int >= 0 (0 = off), got {self.top_k!r}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"DecodeConfig.top_p must be in (0, 1] (1 = off), got {self.top_p!r}.")
        if self.length_penalty_style not in (None, *LENGTH_PENALTY_STYLES):
            raise ValueError(f"DecodeConfig.length_penalty_style={self.length_penalty_style!r} is unknown; use one "
                             f"of {', '.join(LENGTH_PENALTY_STYLES)} (or None: the model's origin).")
        alpha = self.length_penalty_alpha
        if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha >= 0):
            raise ValueError(f"DecodeConfig.length_penalty_alpha must be a number >= 0 (or None), got {alpha!r}.")

    def length_penalty(self, ids: GenerationIds) -> tuple[str, float]:
        """(style, alpha) of beam search for a model with generation ids `ids` (see the fields)."""
        style = self.length_penalty_style or ("hf" if ids.length_penalty is not None else "t5")
        if self.length_penalty_alpha is not None:
            return style, float(self.length_penalty_alpha)
        if style == "t5":
            return style, T5_LENGTH_PENALTY_ALPHA
        return style, HF_LENGTH_PENALTY if ids.length_penalty is None else float(ids.length_penalty)


class DecodeOutput(NamedTuple):
    """tokens int32 [batch, num_decodes, max_decode_length] (pad_token_id after EOS), best first;
    scores float32 [batch, num_decodes]: each sequence's log-likelihood under the model (beam
    search: divided by the length penalty), EOS included."""

    tokens: jax.Array
    scores: jax.Array
