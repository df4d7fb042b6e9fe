"""P-tuning (Liu et al., 2021, "GPT understands, too"): the prompt vectors come from a prompt encoder.

`p_tuning(model, length, hidden, init)` inserts its prompt exactly as prompt
tuning does (`ptmjax.adapt.prompt_tuning`: before the input, the same
families, masks and decoding), but the n vectors are the output of a prompt
encoder over n trainable embeddings instead of parameters themselves. The
encoder is an MLP, relu(E @ wi + b_i) @ wo + b_o with hidden width `hidden`:
the paper's MLP head without its bidirectional LSTM (the paper finds both
reparameterisations help by coupling the prompt vectors; the LSTM is left
out for simplicity). Parameters, in the entry module's scope:
`prompt_encoder_embedding` [n, embed] (initialised as prompt tuning's prompt,
`init`), `prompt_encoder_wi` [embed, hidden], `prompt_encoder_wo` [hidden,
embed] and their biases; `prompt_tuning.PROMPT_PARAMS` matches them.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.adapt.interception import adapted
from ptmjax.adapt.prompt_tuning import PromptSettings
from ptmjax.layers import precision
from ptmjax.layers.embed import Embed
from ptmjax.models.config import check_positive_ints

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class PTuningSettings(PromptSettings):
    """length n, init of the encoder's input embeddings ('vocab' or 'uniform'), the MLP's hidden width."""

    field: ClassVar[str] = "p_tuning"
    class_prefix: ClassVar[str] = "PTuned"
    title: ClassVar[str] = "P-tuning"

    hidden: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_ints(self, "hidden")

    def prompt(self, module: nn.Module, embedder: Embed) -> Array:
        """The prompt encoder's output [n, embed], its parameters created in `module`'s scope."""
        embed, dtype = embedder.features, embedder.param_dtype
        init = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")  # PyTorch's Linear

        def param(name: str, initializer: nn.initializers.Initializer, shape: tuple[int, ...], axes: tuple) -> Array:
            boxed = nn.with_logical_partitioning(initializer, axes)
            return jnp.asarray(module.param(f"prompt_encoder_{name}", boxed, shape, dtype), embedder.dtype)

        inputs = param("embedding", self.initializer(embedder), (self.length, embed), ("prompt", "embed"))
        wi = param("wi", init, (embed, self.hidden), ("embed", "mlp"))
        wi_bias = param("wi_bias", nn.initializers.zeros, (self.hidden,), ("mlp",))
        wo = param("wo", init, (self.hidden, embed), ("mlp", "embed"))
        wo_bias = param("wo_bias", nn.initializers.zeros, (embed,), ("embed",))
        return precision.matmul(jax.nn.relu(precision.matmul(inputs, wi) + wi_bias), wo) + wo_bias


def p_tuning(model: nn.Module, length: int = 20, hidden: int = 128, init: str = "vocab") -> nn.Module:
    """`model` with a P-tuning prompt of `length` vectors (see the module docstring)."""
    return adapted(model, PTuningSettings(length, init, hidden))
