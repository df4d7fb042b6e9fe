"""Every layer's hidden states and attention probabilities of a frozen model, read without editing it.

`LayerReader(module, params)` runs the model's (first) stack of self-attention layers on token ids:
the encoder family (BERT, RoBERTa, ALBERT, ELECTRA), GPT-2, and the encoder of T5 and BART. Hidden
states are [layers + 1, b, s, d] as transformers' `output_hidden_states=True` gives them: the input
of the first layer (the embeddings, after ALBERT's and ELECTRA's projection), then every layer's
output, the last one being what the stack returns (after the final norm of pre-LN models: GPT-2's
ln_f, T5's and mBART's encoder norm). The layer inputs and outputs are recorded by intercepting the
calls of the `layers_{i}` modules (in call order, so ALBERT's shared layers count once per use); the
attention probabilities [layers, b, heads, q, k] are those `MultiHeadAttention` sows into
'intermediates'. A scanned or rematerialised model runs as its plain twin, on unscanned parameters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ptmjax.families.family import ProbedStack
from ptmjax.families.registry import family_of
from ptmjax.layers import layer_stack

LAYER_NAME = re.compile(r"layers_(\d+)")
ATTENTION = "attention"  # the self-attention module of every probed layer


def probed_stack(module: nn.Module) -> ProbedStack:
    """The stack probed in `module` (its family's); raises for a model without one."""
    stack = family_of(module).probed_stack
    if stack is None:
        raise ValueError(
            f"probing reads the encoder family (BERT, RoBERTa, ALBERT, ELECTRA), GPT-2 and the encoder of T5 and "
            f"BART, not {type(module).__name__}; pass one of those models"
        )
    return stack(module)


def stack_depth(module: nn.Module) -> int:
    """Layers of `module`'s probed stack, counting each use of a shared (ALBERT) layer."""
    config = module.config
    return getattr(config, "num_layers", None) or config.num_encoder_layers


def plain_model(module: nn.Module, params: Any) -> tuple[nn.Module, Any]:
    """`module` unscanned and without remat, and `params` in its (unscanned) layout."""
    module, params = layer_stack.unscanned(module, params)
    if getattr(module.config, "remat_policy", "none") != "none":
        module = module.clone(config=dataclasses.replace(module.config, remat_policy="none"))
    return module, params


class LayerOutputs(NamedTuple):
    """hidden float32 [layers + 1, b, s, d]; attention float32 [layers, b, heads, s, s]."""

    hidden: np.ndarray
    attention: np.ndarray


class LayerReader:
    """A frozen model's hidden states and attention maps per layer (see the module doc); one jitted call.

    A model whose probed stack reads character ids (ELMo) returns its layers itself and has no attention
    maps (attention [0, b, 0, s, s]); its tokens' character ids come from `vocabulary.character_table`
    (ptmjax/data/word_vocabulary.py)."""

    def __init__(self, module: nn.Module, params: Any, vocabulary: Any = None):
        self.module, params = plain_model(module, params)
        self.params = jax.device_put(params)  # once, not at every call
        self.stack = probed_stack(self.module)
        self._characters = None
        if self.stack.characters_field is not None:
            if not hasattr(vocabulary, "character_table"):
                raise ValueError(f"{type(self.module).__name__} reads character ids: pass LayerReader the model's "
                                 f"word vocabulary (ptmjax.data.word_vocabulary.WordVocabulary), not {vocabulary}")
            self._characters = np.asarray(vocabulary.character_table)
        self._run = jax.jit(self._outputs if self.has_attention else self._layers)

    @property
    def has_attention(self) -> bool:
        """Whether the model has attention maps (ELMo has none)."""
        return self.stack.characters_field is None

    @property
    def num_layers(self) -> int:
        """Layers of the probed stack, counting each use of a shared (ALBERT) layer."""
        return stack_depth(self.module)

    def __call__(self, tokens: np.ndarray) -> LayerOutputs:
        """tokens int [b, s], padded with the model's pad id (GPT-2: any id after the real ones)."""
        if not self.has_attention:
            b, s = np.shape(tokens)
            hidden = self._run(self.params, jnp.asarray(tokens, jnp.int32), self._characters[np.asarray(tokens)])
            return LayerOutputs(np.asarray(hidden), np.zeros((0, b, 0, s, s), np.float32))
        hidden, attention = self._run(self.params, jnp.asarray(tokens, jnp.int32))
        return LayerOutputs(np.asarray(hidden), np.asarray(attention))

    def _layers(self, params: Any, tokens: jax.Array, characters: jax.Array) -> jax.Array:
        inputs = {self.stack.tokens_field: tokens, self.stack.characters_field: characters}
        return self.module.apply({"params": params}, **inputs, method=self.stack.method).astype(jnp.float32)

    def _outputs(self, params: Any, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
        with recorded_layer_calls(self.stack) as calls:
            final, variables = self.module.apply(
                {"params": params}, **{self.stack.tokens_field: tokens}, method=self.stack.method,
                mutable=["intermediates"],
            )
        if len(calls) != self.num_layers:
            raise AssertionError(f"recorded {len(calls)} layer calls, expected {self.num_layers}")
        hidden = [calls[0][0], *(output for _, output in calls[:-1]), final]
        return jnp.stack(hidden).astype(jnp.float32), stack_attention(variables["intermediates"], self.stack)


@contextlib.contextmanager
def recorded_layer_calls(stack: ProbedStack) -> Iterator[list[tuple[jax.Array, jax.Array]]]:
    """Within the block, the (input, output) of every call of `stack`'s `layers_{i}` modules, in call order
    (ALBERT's shared layers once per use), appended to the list it gives; the model must be plain
    (`plain_model`)."""
    calls: list[tuple[jax.Array, jax.Array]] = []

    def record_layer(next_fun, args, kwargs, context):
        output = next_fun(*args, **kwargs)
        path = context.module.path
        if context.method_name == "__call__" and path and path[:-1] == stack.path and LAYER_NAME.fullmatch(path[-1]):
            calls.append((args[0], output))
        return output

    with nn.intercept_methods(record_layer):
        yield calls


def stack_attention(intermediates: Any, stack: ProbedStack, sown: str = "attention_weights") -> jax.Array:
    """The self-attention probabilities `stack`'s layers sowed into 'intermediates', in call order:
    [layers, b, heads, q, k] (the einsum attention path sows them); with sown='values' their values,
    [layers, b, heads, k, head width]."""
    node = intermediates
    for name in stack.path:
        node = node[name]
    names = sorted((n for n in node if LAYER_NAME.fullmatch(n)), key=lambda n: int(LAYER_NAME.fullmatch(n)[1]))
    weights = [w for name in names for w in node[name][ATTENTION][sown]]
    return jnp.stack(weights).astype(jnp.float32)


def padded_batch(rows: list[list[int]], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token rows cut to `length` and right-padded: (tokens int32 [n, length], valid bool [n, length])."""
    tokens = np.full((len(rows), length), pad_id, np.int32)
    valid = np.zeros((len(rows), length), bool)
    for i, row in enumerate(rows):
        row = row[:length]
        tokens[i, : len(row)], valid[i, : len(row)] = row, True
    return tokens, valid
