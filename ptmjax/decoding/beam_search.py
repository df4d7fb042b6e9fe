"""Beam search over a `Prefill`, in one `lax.while_loop`, as T5X and Hugging Face do it.

Each step extends every live beam by every token and keeps the 2k best
candidates (k = beams). Those of the first k that end (EOS, or the last
step) join the k finished sequences if they score higher, with the length
penalty applied; the best k that did not emit EOS live on, their caches
picked from their parents'. A row closes once it holds k finished sequences
and its best live beam, divided by a best-case penalty, no longer beats the
worst of them; a closed row takes no more finished sequences. The loop ends
when every row is closed, or after the last step.

Two length penalties divide a finished beam's sum of log-probabilities
(length: the tokens generated, EOS included):
- 't5': ((5 + length) / 6) ** alpha (GNMT, T5; T5 uses alpha 0.6). The
  best case is the longest length's penalty, so a row closes only when no
  live beam can still win (log-probabilities only fall).
- 'hf': length ** alpha, Hugging Face's `length_penalty` (1.0 by default),
  with the best case at the current length, the heuristic of
  `generate(num_beams=k)`'s default `early_stopping=False`: token for token
  what `generate` returns.
With alpha = 0 both are the plain sum and the same search.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ptmjax.decoding.cache import repeat_rows, take_beams
from ptmjax.decoding.config import LENGTH_PENALTY_STYLES
from ptmjax.decoding.generation_ids import GenerationIds
from ptmjax.decoding.prefill import Prefill
from ptmjax.decoding.sampling import forced_tokens

Array = jax.Array


def length_penalty(length: Array | int, alpha: float, style: str = "t5") -> Array:
    """The divisor of a finished beam's score with `length` tokens (see the module doc); 1 for alpha = 0."""
    length = jnp.asarray(length, jnp.float32)
    if style == "t5":
        return ((5.0 + length) / 6.0) ** alpha
    if style == "hf":
        return length**alpha
    raise ValueError(f"length penalty style {style!r} is unknown; use one of {', '.join(LENGTH_PENALTY_STYLES)}")


def _take(values: Array, indices: Array) -> Array:
    """values [b, m, ...] at indices [b, k] along axis 1 -> [b, k, ...]."""
    expanded = indices.reshape(indices.shape + (1,) * (values.ndim - 2))
    return jnp.take_along_axis(values, expanded, axis=1)


def beam_search(
    prefill: Prefill, num_beams: int, max_decode_length: int, ids: GenerationIds, alpha: float = 0.6,
    style: str = "t5",
) -> tuple[Array, Array]:
    """-> tokens int32 [b, num_beams, max_decode_length] and scores float32 [b, num_beams], best first.

    `ids` as `GenerationIds.for_decoding` gives them (EOS and pad set); `alpha` and `style`: the length penalty.
    """
    eos_id, pad_id = ids.eos_token_id, ids.pad_token_id
    rows, vocab = prefill.first_logits.shape
    k, length = num_beams, max_decode_length
    length_penalty(1, alpha, style)  # an unknown style raises here

    def closed(steps: Array, live_scores: Array, done_scores: Array) -> Array:
        """[b]: rows whose k finished sequences no live beam can beat after `steps` steps (the best case)."""
        best_case = length_penalty(length if style == "t5" else jnp.maximum(steps, 1), alpha, style)
        worst_done = done_scores[:, -1]
        return (worst_done > -jnp.inf) & (live_scores[:, 0] / best_case <= worst_done)

    def extend(i: Array, live_tokens: Array, live_scores: Array, done_tokens: Array, done_scores: Array,
               logits: Array, open_rows: Array) -> tuple:
        """Step i of every row's beams -> (live tokens, live scores, done tokens, done scores, the live
        beams' new tokens [b * k], the rows [b * k] whose caches they continue)."""
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1).reshape(rows, k, vocab)
        candidates = (live_scores[:, :, None] + forced_tokens(log_probs, i, length, ids)).reshape(rows, -1)
        scores, flat = jax.lax.top_k(candidates, 2 * k)  # [b, 2k]
        parents, tokens = flat // vocab, (flat % vocab).astype(jnp.int32)
        sequences = _take(live_tokens, parents).at[:, :, i].set(tokens)  # [b, 2k, length]
        ends = (tokens == eos_id) | (i == length - 1)
        finishing = ends & (jnp.arange(2 * k) < k) & open_rows[:, None]
        finished_scores = jnp.where(finishing, scores / length_penalty(i + 1, alpha, style), -jnp.inf)
        done_scores, best = jax.lax.top_k(jnp.concatenate([done_scores, finished_scores], axis=1), k)
        done_tokens = _take(jnp.concatenate([done_tokens, sequences], axis=1), best)
        live_scores, best = jax.lax.top_k(jnp.where(tokens == eos_id, -jnp.inf, scores), k)
        source_rows = (jnp.arange(rows)[:, None] * k + _take(parents, best)).reshape(-1)
        next_tokens = _take(tokens, best).reshape(-1)
        return _take(sequences, best), live_scores, done_tokens, done_scores, next_tokens, source_rows

    def body(state: tuple) -> tuple:
        i, live_tokens, live_scores, done_tokens, done_scores, open_rows, decode_state, logits = state
        live_tokens, live_scores, done_tokens, done_scores, tokens, source_rows = extend(
            i, live_tokens, live_scores, done_tokens, done_scores, logits, open_rows
        )
        open_rows = open_rows & ~closed(i + 1, live_scores, done_scores)
        logits, decode_state = prefill.step(take_beams(decode_state, source_rows), tokens, i)
        return i + 1, live_tokens, live_scores, done_tokens, done_scores, open_rows, decode_state, logits

    def running(state: tuple) -> Array:
        return (state[0] < length) & jnp.any(state[5])

    first_live = jnp.where(jnp.arange(k) == 0, 0.0, -jnp.inf)  # one live beam per row at first
    empty = jnp.full((rows, k, length), pad_id, jnp.int32)
    state = (
        jnp.zeros((), jnp.int32), empty, jnp.tile(first_live, (rows, 1)), empty, jnp.full((rows, k), -jnp.inf),
        jnp.ones((rows,), bool), repeat_rows(prefill.state, k), jnp.repeat(prefill.first_logits, k, axis=0),
    )
    # The model never runs on the last step's tokens: the loop stops before it, and it is taken after.
    state = jax.lax.while_loop(lambda state: running(state) & (state[0] < length - 1), body, state)
    i, live_tokens, live_scores, done_tokens, done_scores, open_rows, _, logits = state
    return jax.lax.cond(
        running(state),
        lambda: extend(i, live_tokens, live_scores, done_tokens, done_scores, logits, open_rows)[2:4],
        lambda: (done_tokens, done_scores),
    )
