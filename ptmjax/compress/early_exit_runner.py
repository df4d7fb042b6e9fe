"""Early exit that stops computing: an early-exit model run one layer at a time, with a host check after each.

`LayerByLayer(module, params, policy)` runs the embeddings, then for each layer one jitted call (the
layer, its exit, the policy's `step`: ptmjax/compress/early_exit_policies.py) and reads on the host
whether every row of the batch has left; if so, the later layers are not computed. A batch thus
costs as many layers as its last row to leave needs: what `exit_decisions` over all layers decides,
with `layers_run` saying how many layers ran. This is the path for measured speed; the jitted
all-layers path (`exit_logits` and `exit_decisions`) is the one to train and evaluate with.

Each layer is the encoder's `PostLNLayer` applied to its own parameters (ALBERT's shared ones
for each use), so a model whose layers hold other parameters (LoRA, adapters) is refused.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from ptmjax.compress.early_exit import check_exit_model, exit_depth
from ptmjax.compress.early_exit_policies import ExitPolicy, ExitState
from ptmjax.models.encoder import PostLNLayer

Array = jax.Array


class LayerByLayerResult(NamedTuple):
    """state: the rows' exits (ExitState); layers_run: the layers computed for the batch."""

    state: ExitState
    layers_run: int


class LayerByLayer:
    """An early-exit model's exits under `policy`, computing layers only until every row has left."""

    def __init__(self, module: nn.Module, params: Any, policy: ExitPolicy):
        check_exit_model(module, "LayerByLayer")
        self.module, self.policy = module, policy
        self.params = jax.device_put(nn.unbox(params))
        self.depth = exit_depth(module)
        self._repeats = self.depth // module.config.layer_groups
        self._check_plain_layers()
        self._embed = jax.jit(functools.partial(module.apply, method="embedded"))

    def __call__(self, input_tokens: np.ndarray, token_type_ids: np.ndarray | None = None) -> LayerByLayerResult:
        """input_tokens int [b, s] padded with the model's pad id -> the exits and the layers computed."""
        tokens = jnp.asarray(input_tokens, jnp.int32)
        types = None if token_type_ids is None else jnp.asarray(token_type_ids, jnp.int32)
        x = self._embed({"params": self.params}, tokens, types)
        state = ExitState.start(jnp.zeros((tokens.shape[0], self.module.num_labels), jnp.float32))
        for index in range(self.depth):
            x, state = _layer_step(self.module, self.policy, index, self._repeats, self.params, x, tokens, state)
            if bool(jnp.all(state.exited)):
                return LayerByLayerResult(state, index + 1)
        raise AssertionError("every row leaves at the last layer")

    def _check_plain_layers(self) -> None:
        """Refuse layers whose parameters are not exactly `PostLNLayer`'s (LoRA, adapters)."""
        plain = jax.eval_shape(
            lambda: nn.unbox(_layer(self.module).init(
                jax.random.key(0), jnp.ones((1, 1, self.module.config.d_model)),
                self.module.apply({"params": self.params}, jnp.ones((1, 1), jnp.int32), jnp.float32,
                                  method="attention_mask"),
            ))["params"]
        )
        own = self.params["layers_0"]
        if jax.tree.structure(plain) != jax.tree.structure(own):
            raise ValueError(
                f"LayerByLayer runs plain encoder layers, but {type(self.module).__name__}'s layers hold other "
                "parameters (LoRA, adapters); merge them first or evaluate with exit_logits and exit_decisions."
            )


def _layer(module: nn.Module) -> nn.Module:
    return PostLNLayer(module.config)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _layer_step(
    module: nn.Module, policy: ExitPolicy, index: int, repeats: int, params: Any, x: Array, tokens: Array,
    state: ExitState,
) -> tuple[Array, ExitState]:
    """Layer `index` (0-based) on x, its exit's logits, and the policy's step: (new x, new state)."""
    mask = module.apply({"params": params}, tokens, x.dtype, method="attention_mask")
    x = _layer(module).apply({"params": params[f"layers_{index // repeats}"]}, x, mask)
    logits = module.apply({"params": params}, index, x, method="exit_at")
    depth = exit_depth(module)
    return x, policy.step(state, logits, index + 1, last=index == depth - 1)
