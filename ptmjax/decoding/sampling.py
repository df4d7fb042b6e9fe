"""Greedy decoding and sampling (temperature, top-k, top-p) over a `Prefill`, in one `lax.while_loop`.

Each row stops at EOS (later slots get the pad id) and the loop ends when
every row has, or after `max_decode_length` tokens. Scores are the model's
log-likelihood of the chosen tokens (a forced token counts 0, as in Hugging
Face), whatever the temperature or filters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ptmjax.decoding.generation_ids import GenerationIds
from ptmjax.decoding.prefill import Prefill

Array = jax.Array


def forced_tokens(log_probs: Array, i: Array, length: int, ids: GenerationIds) -> Array:
    """log_probs [..., vocab] of step i with only the forced token allowed (log-probability 0):
    `ids.forced_bos_token_id` at the first step, `ids.forced_eos_token_id` at the last (of `length`)."""
    for step, token in ((0, ids.forced_bos_token_id), (length - 1, ids.forced_eos_token_id)):
        if token is not None:
            forced = jnp.where(jnp.arange(log_probs.shape[-1]) == token, 0.0, -jnp.inf)
            log_probs = jnp.where(i == step, forced, log_probs)
    return log_probs


def filter_logits(logits: Array, top_k: int = 0, top_p: float = 1.0) -> Array:
    """logits [n, vocab] with -inf outside the top_k (0 = all) and outside the smallest set of
    most likely tokens whose probabilities reach top_p (the most likely token always stays)."""
    if top_k:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # probability mass of the more likely tokens
        kept = jnp.where(before < top_p, sorted_logits, jnp.inf)
        logits = jnp.where(logits < jnp.min(kept, axis=-1, keepdims=True), -jnp.inf, logits)
    return logits


def sample(
    prefill: Prefill, max_decode_length: int, ids: GenerationIds, rng: Array | None = None,
    temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
) -> tuple[Array, Array]:
    """-> tokens int32 [n, max_decode_length], scores float32 [n]. Greedy (argmax) without `rng`.

    `ids` as `GenerationIds.for_decoding` gives them (EOS and pad set).
    """
    eos_id, pad_id = ids.eos_token_id, ids.pad_token_id
    rows = prefill.first_logits.shape[0]

    def choose(log_probs: Array, key: Array) -> Array:
        if rng is None:
            return jnp.argmax(log_probs, axis=-1).astype(jnp.int32)
        logits = filter_logits(log_probs / temperature, top_k, top_p)
        return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)

    def choose_next(i: Array, tokens: Array, logits: Array, finished: Array, scores: Array, key: Array) -> tuple:
        """Step i's tokens chosen from its logits and recorded -> (tokens, step i's [n], finished, scores, key)."""
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        log_probs = forced_tokens(log_probs, i, max_decode_length, ids)
        key, draw = jax.random.split(key)
        token = choose(log_probs, draw)
        token_log_prob = jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]
        scores = scores + jnp.where(finished, 0.0, token_log_prob)
        token = jnp.where(finished, pad_id, token)
        tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, i))
        return tokens, token, finished | (token == eos_id), scores, key

    def body(state: tuple) -> tuple:
        i, tokens, decode_state, logits, finished, scores, key = state
        tokens, token, finished, scores, key = choose_next(i, tokens, logits, finished, scores, key)
        logits, decode_state = prefill.step(decode_state, token, i)
        return i + 1, tokens, decode_state, logits, finished, scores, key

    def running(state: tuple) -> Array:
        i, finished = state[0], state[4]
        return (i < max_decode_length) & ~jnp.all(finished)

    state = (
        jnp.zeros((), jnp.int32), jnp.full((rows, max_decode_length), pad_id, jnp.int32), prefill.state,
        prefill.first_logits, jnp.zeros((rows,), bool), jnp.zeros((rows,), jnp.float32),
        jax.random.key(0) if rng is None else rng,
    )
    # The model never runs on the last tokens: the loop stops before them, and they are chosen after it.
    state = jax.lax.while_loop(lambda state: running(state) & (state[0] < max_decode_length - 1), body, state)
    i, tokens, _, logits, finished, scores, key = state

    def last_tokens() -> tuple[Array, Array]:
        last, _, _, last_scores, _ = choose_next(i, tokens, logits, finished, scores, key)
        return last, last_scores

    return jax.lax.cond(running(state), last_tokens, lambda: (tokens, scores))
