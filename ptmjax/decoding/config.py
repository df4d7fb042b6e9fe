"""How to decode: the algorithm and its settings, and what a decode returns."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import gin
import jax

METHODS = ("greedy", "beam", "sample")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """How `ModelApi.predict` decodes.

    method: 'greedy', 'beam' (beam search) or 'sample' (temperature, top-k, top-p).
    max_decode_length: the most tokens generated per sequence, EOS included.
    num_beams: the beam width (method='beam').
    length_penalty_alpha: a beam's score is sum(log p) / ((5 + length) / 6) ** alpha, T5's and
      GNMT's length penalty (T5 uses 0.6); 0 ranks by the plain sum of log-probabilities.
    temperature, top_k (0 = off), top_p (1.0 = off): method='sample' draws from
      softmax(logits / temperature) restricted to the top_k tokens and to the smallest set whose
      probabilities sum to top_p.
    num_decodes: sequences returned per input: samples drawn (method='sample'), or the best
      beams (method='beam', at most num_beams).
    """

    method: str = "greedy"
    max_decode_length: int = 64
    num_beams: int = 4
    length_penalty_alpha: float = 0.6
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
        if self.length_penalty_alpha < 0:
            raise ValueError(f"DecodeConfig.length_penalty_alpha must be >= 0, got {self.length_penalty_alpha!r}.")


class DecodeOutput(NamedTuple):
    """tokens int32 [batch, num_decodes, max_decode_length] (pad_token_id after EOS), best first;
    scores float32 [batch, num_decodes]: each sequence's log-likelihood under the model (beam
    search: divided by the length penalty), EOS included."""

    tokens: jax.Array
    scores: jax.Array
