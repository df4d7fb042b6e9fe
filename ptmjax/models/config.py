"""The config base every model family shares, and the checks of its `__post_init__`.

Every error names the field and the fix.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from ptmjax.layers.attention import ATTENTION_KERNELS
from ptmjax.layers.attention_patterns import AttentionPattern
from ptmjax.layers.common import DTYPES
from ptmjax.layers.context_parallel import CONTEXT_PARALLEL_FORMS
from ptmjax.layers.layer_stack import LayerStackConfig
from ptmjax.layers.mlp import ACTIVATIONS


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig(LayerStackConfig):
    """The fields every family repeats, keyword-only (a family may change a default):

    dropout_rate: on embeddings and residual branches.
    layer_norm_epsilon: of every norm.
    dtype: activation/compute dtype ('float32', 'bfloat16', or 'float16' with DynamicLossScale);
      param_dtype: storage dtype.
    remat_policy, scan_layers, layerdrop, decoder_layerdrop: how the layer stacks run (LayerStackConfig).
    attention_kernel: 'einsum' (the reference), 'xla' / 'cudnn' for `jax.nn.dot_product_attention`
      with that implementation (an unpacked batch's padding goes to them as sequence lengths, so it
      must be at the end of each row, as seqio and tokenizers put it: a padding id before a row's last
      token counts as a token), 'pallas_tpu_flash' for JAX's Pallas TPU flash-attention kernel
      (interpreted on CPU), or 'blockwise', the fastest on a CPU: large attention one example and query
      block at a time, or 'performer', FAVOR+ random-feature attention, linear in the length, with
      `performer_features` features (GPT-2, the BERT family, BART; ptmjax/layers/attention.py's
      ATTENTION_KERNELS).
    context_parallel_attention: under a mesh whose rules split 'activation_length' (gin_configs/mesh/cp.gin),
      how self-attention spans the split sequence: 'all_gather' (each device gathers the keys and values) or
      'ring' (they travel around the context axis); GPT-2 and T5 (ptmjax/layers/context_parallel.py).

    The activation is not among them: T5 names a tuple (`ffn_activations`,
    gated or not), the others one function (`activation`, see `check_activation`).
    """

    dropout_rate: float = 0.1
    layer_norm_epsilon: float = 1e-6
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention_kernel: str = "einsum"
    performer_features: int = 256
    context_parallel_attention: str = "all_gather"

    def check_model_config(self, *other_rates: str) -> None:
        """Dropout rates (dropout_rate and `other_rates`) in [0, 1), epsilon > 0, supported dtypes, stack options."""
        owner = type(self).__name__
        check_rates(self, "dropout_rate", *other_rates)
        if not self.layer_norm_epsilon > 0:
            raise ValueError(f"{owner}.layer_norm_epsilon must be > 0, got {self.layer_norm_epsilon!r}.")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"{owner}.{name}={getattr(self, name)!r} is not supported; use one of {list(DTYPES)}.")
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise ValueError(
                f"{owner}.attention_kernel={self.attention_kernel!r} is unknown; use one of {list(ATTENTION_KERNELS)}."
            )
        check_positive_ints(self, "performer_features")
        if self.context_parallel_attention not in CONTEXT_PARALLEL_FORMS:
            raise ValueError(f"{owner}.context_parallel_attention={self.context_parallel_attention!r} is unknown; use "
                             f"one of {list(CONTEXT_PARALLEL_FORMS)}.")
        self.check_layer_stacks()

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(DTYPES[self.dtype])

    @property
    def weight_dtype(self) -> jnp.dtype:
        return jnp.dtype(DTYPES[self.param_dtype])


def check_positive_ints(config: Any, *names: str) -> None:
    """Raise unless every named field is a positive int (bools rejected)."""
    owner = type(config).__name__
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}.")


def check_rates(config: Any, *names: str) -> None:
    """Raise unless every named field (a dropout rate) is in [0, 1)."""
    for name in names:
        value = getattr(config, name)
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{type(config).__name__}.{name} must be in [0, 1), got {value!r}.")


def check_heads_divide(config: Any) -> None:
    """Raise unless num_heads divides d_model (head_dim = d_model // num_heads)."""
    owner = type(config).__name__
    if config.d_model % config.num_heads:
        raise ValueError(
            f"{owner}.d_model={config.d_model} is not divisible by num_heads={config.num_heads}; "
            "pick num_heads dividing d_model."
        )


def check_attention_pattern(config: Any) -> None:
    """Raise unless `config.attention_pattern` is None or a sparse attention pattern."""
    if config.attention_pattern is not None and not isinstance(config.attention_pattern, AttentionPattern):
        raise ValueError(f"{type(config).__name__}.attention_pattern must be an attention pattern (e.g. "
                         f"@SlidingWindow()) or None, got {config.attention_pattern!r}")


def check_activation(config: Any) -> None:
    """Raise unless `config.activation` is a known activation."""
    if config.activation not in ACTIVATIONS:
        raise ValueError(
            f"{type(config).__name__}.activation={config.activation!r} is unknown; known: {sorted(ACTIVATIONS)}."
        )
