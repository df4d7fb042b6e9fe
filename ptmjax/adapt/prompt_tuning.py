"""Prompt tuning (Lester et al., 2021): n trainable vectors prepended to the input embeddings.

`prompt_tuning(model, length, init)` returns the model adapted by
interception (`ptmjax.adapt.interception`); no model code changes, so the
base model's outputs stay bit-identical. The interceptor watches each
family's embedding-level entry (`entries.ENTRIES`): it lengthens the token ids by n
placeholder ids (not the padding id) in front, so every mask, position and
length check the model derives from the ids covers the prompt, and replaces
the token embeddings at those n positions with the prompt. The other
per-token inputs grow with it: segment ids copy the row's first one, token
types are 0, explicit positions become 0..n-1 then the given ones + n.

- T5: the encoder's input, `encoder/soft_prompt` [n, d_model]. The encoded
  output keeps the n prompt positions (the decoder attends to them, as in
  Lester); the decoder's view of the encoder ids (its cross mask) grows by
  the same n, so `encode` + `decode` and decoding's cached steps work.
- BART / mBART: as T5, `encoder/soft_prompt` [n, d_model]; the prompt gets
  positions 0..n-1 and goes through the embedding scale and LayerNorm like
  the tokens after it.
- BERT family: before everything, [CLS] included (as Hugging Face PEFT),
  `soft_prompt` [n, embed_dim] in place of token embeddings, so the position
  and token type embeddings and the LayerNorm apply to it too; `encode` drops
  the n prompt outputs, so the heads see [b, s] as before and first-token
  heads pool the real [CLS], not a prompt vector.
- GPT-2: before the tokens, `soft_prompt` [n, d_model] (with positions
  0..n-1, the tokens n, n+1, ...); the prompt is causal (never in a prefix
  LM's bidirectional prefix, so it sees only itself) and `hidden_states` drops
  its n outputs, so logits align with targets. Cached decoding: as the
  prompt sees only itself, its keys and values in each layer are the same
  for every input, so each cached call first runs the prompt alone (one
  placeholder token after it) to take them, then runs the call's tokens at
  positions + n with every self-attention attending to the prompt's keys
  and values before the cache's, as prefix tuning does: the same outputs as
  the prompt in front, at the cost of n more positions per call. This needs
  layers that are neither scanned nor rematerialised (the keys and values
  are read out of each layer).

Packed rows (several segments per row) would show the prompt to the first
segment only: train prompt methods with unpacked examples.
Initialisation: 'vocab' copies the embeddings of n token ids sampled
uniformly from the vocabulary (Lester's best, there from the 5,000 most
common), 'uniform' draws from U(-0.5, 0.5). `PROMPT_PARAMS` matches the
prompt (and P-tuning's prompt encoder, `ptmjax.adapt.p_tuning`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.adapt.interception import adapted
from ptmjax.adapt.prefix_tuning import with_prefix
from ptmjax.families.entries import Entry, entry_of, runs_stack
from ptmjax.layers.attention import MultiHeadAttention
from ptmjax.layers.attention_mask import AttentionMask
from ptmjax.layers.embed import Embed
from ptmjax.layers.positions import sequential_positions
from ptmjax.models.config import check_positive_ints

Array = jax.Array

PROMPT_PARAMS = r"^(.*/)?(soft_prompt|prompt_encoder_\w+)$"  # unboxed paths, e.g. 'encoder/soft_prompt'
INITS = ("vocab", "uniform")
UNIFORM_RANGE = 0.5


@dataclasses.dataclass(frozen=True)
class PromptSettings:
    """length n of the soft prompt and its init ('vocab' or 'uniform')."""

    field: ClassVar[str] = "prompt_tuning"
    class_prefix: ClassVar[str] = "PromptTuned"
    title: ClassVar[str] = "prompt tuning"

    length: int = 20
    init: str = "vocab"

    def __post_init__(self) -> None:
        check_positive_ints(self, "length")
        if self.init not in INITS:
            raise ValueError(f"{self.field} init={self.init!r} is unknown; use one of {INITS}.")

    def start(self, model: nn.Module, arguments: dict[str, Any]) -> PromptCall:
        return PromptCall(self)

    def prompt(self, module: nn.Module, embedder: Embed) -> Array:
        """The prompt [n, embed], its parameters created in `module`'s scope."""
        return module.param(
            "soft_prompt", nn.with_logical_partitioning(self.initializer(embedder), ("prompt", "embed")),
            (self.length, embedder.features), embedder.param_dtype,
        )

    def initializer(self, embedder: Embed) -> Callable[..., Array]:
        """init(rng, shape, dtype) of vectors [n, embed] like token embeddings (see the module docstring)."""
        if self.init == "uniform":
            return _uniform
        table = embedder.embedding

        def sampled(rng: Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> Array:
            ids = jax.random.randint(rng, shape[:1], 0, table.shape[0])
            return jnp.asarray(table[ids], dtype)

        return sampled


def _uniform(rng: Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> Array:
    return jax.random.uniform(rng, shape, dtype, -UNIFORM_RANGE, UNIFORM_RANGE)


@dataclasses.dataclass
class PromptCall:
    """A prompt model call in progress: lengthens the ids at each entry and swaps in the prompt's embeddings."""

    settings: PromptSettings
    embedder: Embed | None = None  # the entry's token embedder, until a stack method creates the prompt
    pending: Array | None = None  # the prompt, until the entry's token embedding takes it
    entered: int = 0
    prompt_keys_values: dict[tuple[str, ...], Array] | None = None  # cached decoding: by attention path
    reading_prompt: bool = False  # cached decoding: the prompt-only call that fills prompt_keys_values

    def intercept(self, next_fun: Callable[..., Any], args: tuple, kwargs: dict, context: Any) -> Any:
        module = context.module
        if isinstance(module, MultiHeadAttention) and context.method_name == "attended" and not module.cross_attention:
            return self._attended(module, next_fun(*args, **kwargs))
        token_embedding = isinstance(module, Embed) and module.axes[0] == "vocab" and context.method_name == "__call__"
        if self.pending is not None and token_embedding:
            out = next_fun(*args, **kwargs)
            prompt, self.pending = self.pending, None
            rows = jnp.broadcast_to(jnp.asarray(prompt, out.dtype), (out.shape[0], *prompt.shape))
            return jnp.concatenate([rows, out[:, prompt.shape[0] :]], axis=1)
        entry = entry_of(module, context.method_name)
        if entry is None:
            self._create_prompt_in(module, context.method_name)
            return next_fun(*args, **kwargs)
        self.entered += 1
        arguments = inspect.signature(getattr(type(module), context.method_name)).bind(module, *args, **kwargs)
        arguments = dict(arguments.arguments)
        del arguments["self"]
        if entry.embedder is not None and arguments.get("cache") is not None:
            return self._cached_call(module, context.method_name, next_fun, arguments, entry)
        n = self.settings.length
        arguments.update(_grown(arguments, entry, n, entry.pad_id(module)))
        if entry.embedder is not None:
            self.embedder = entry.embedder(module)
        self._create_prompt_in(module, context.method_name)
        out = next_fun(**arguments)
        return out[:, n:] if entry.drops_prompt else out

    def _cached_call(
        self, module: nn.Module, method: str, next_fun: Callable[..., Any], arguments: dict[str, Any], entry: Entry
    ) -> Any:
        """A decoding call of a decoder-only model: its tokens after the prompt's keys and values (see the module
        docstring)."""
        n, config, cache = self.settings.length, module.config, arguments["cache"]
        if config.scan_layers or config.remat_policy != "none":
            raise ValueError(
                f"cached decoding of a prompt-tuned {type(module.config).__name__} reads the prompt's keys and values "
                f"out of each layer; set {type(config).__name__}.scan_layers = False and remat_policy = 'none' to "
                "decode (training may keep them)"
            )
        if cache.length + n > config.max_length:
            raise ValueError(
                f"decoding {cache.length} positions after a prompt of {n} needs {cache.length + n} positions, more "
                f"than {type(config).__name__}.max_length = {config.max_length}; decode fewer tokens"
            )
        tokens = arguments[entry.tokens]
        self.prompt_keys_values, self.reading_prompt = {}, True
        getattr(module, method)(jnp.ones((tokens.shape[0], 1), tokens.dtype))  # the prompt alone, uncached
        self.reading_prompt = False
        positions = next(name for name, how in entry.companions.items() if how == "positions")
        arguments[positions] = (sequential_positions(tokens) if arguments.get(positions) is None
                                else arguments[positions]) + n
        try:
            return next_fun(**arguments)
        finally:
            self.prompt_keys_values = None

    def _attended(self, module: MultiHeadAttention, out: tuple[Array, Array, AttentionMask]) -> Any:
        """A self-attention's keys, values and mask: the prompt's part taken while reading the prompt, the prompt's
        keys and values put in front during a cached call; as they were otherwise."""
        if self.prompt_keys_values is None:
            return out
        key, value, mask = out
        path, n = module.scope.path, self.settings.length
        if self.reading_prompt:
            self.prompt_keys_values[path] = jnp.stack([key[0, :, :n], value[0, :, :n]])  # [2, h, n, d]: every row's
            return out
        return with_prefix(key, value, mask, self.prompt_keys_values[path])

    def _create_prompt_in(self, module: nn.Module, method: str) -> None:
        """Creates the awaited prompt in the scope of `module.method` if that runs a layer stack (a compact method:
        BART's entry, `encode`, is not, so its prompt lives in its encoder stack's scope, as T5's)."""
        if self.embedder is not None and runs_stack(module, method):
            self.pending, self.embedder = self.settings.prompt(module, self.embedder), None

    def finish(self, model: nn.Module) -> None:
        if model.is_initializing() and not self.entered:
            raise ValueError(
                f"{self.settings.title} found no token input in {type(model).__name__}; it adapts T5, BART, GPT-2 and "
                "the BERT family."
            )


def prompt_tuning(model: nn.Module, length: int = 20, init: str = "vocab") -> nn.Module:
    """`model` with a soft prompt of `length` vectors (see the module docstring)."""
    return adapted(model, PromptSettings(length, init))


def _grown(arguments: dict[str, Any], entry: Entry, n: int, pad_id: int) -> dict[str, Any]:
    """The entry's ids and their companions with n prompt positions in front."""
    tokens = arguments[entry.tokens]
    rows = tokens.shape[0]
    placeholder = 1 if pad_id != 1 else 2
    grown = {entry.tokens: jnp.concatenate([jnp.full((rows, n), placeholder, tokens.dtype), tokens], axis=1)}
    for name, how in entry.companions.items():
        value = arguments.get(name)
        if value is None:
            continue
        if how == "first":
            front = jnp.broadcast_to(value[:, :1], (value.shape[0], n))
        elif how == "zeros":
            front = jnp.zeros((value.shape[0], n), value.dtype)
        else:
            front, value = jnp.broadcast_to(jnp.arange(n, dtype=value.dtype), (value.shape[0], n)), value + n
        grown[name] = jnp.concatenate([front.astype(value.dtype), value], axis=1)
    return grown
