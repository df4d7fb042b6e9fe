"""ELECTRA: generator and discriminator on the shared post-LN encoder, and the joint pre-training module.

- `ElectraDiscriminator` (HF ElectraForPreTraining): encoder + replaced-token
  head -> logits [b, s].
- `ElectraGenerator` (HF ElectraForMaskedLM): encoder + MLM head -> logits
  [b, s, vocab]. Its head's activation is always exact GELU, as in Hugging Face.
- `ElectraPretraining`: a (small) generator and the discriminator sharing one
  embedding block, as the ELECTRA code does (the "electra/embeddings" scope):
  the token, position and token-type tables and the embedding LayerNorm are one
  set of parameters, `embeddings/...`; the generator's MLM logits are tied to
  that token table. Each model keeps its own projection E -> d_model, layers
  and head (`generator/...`, `discriminator/...`).

The joint `__call__(input_tokens, target_tokens, loss_mask, token_type_ids=None,
enable_dropout=False)` runs the generator on the MLM-masked `input_tokens`;
at positions with loss_mask = 1 it replaces the token by a sample of the
generator's softmax (rng stream 'sample', gradients stopped; the padding id is
never sampled, so the discriminator's attention mask stays that of the
original), elsewhere it keeps `target_tokens`; the discriminator reads that
corrupted sequence. `is_replaced = corrupted != target_tokens`: a sample equal
to the original token counts as not replaced.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import flax.struct
import gin
import jax
import jax.numpy as jnp

from ptmjax.layers.common import dtype_kwargs
from ptmjax.layers.layer_stack import LayerStacks
from ptmjax.models.encoder import Embeddings, EncoderConfig, MaskedLMEncoder, PostLNEncoder
from ptmjax.models.encoder_heads import DiscriminatorHead

Array = jax.Array

# What the shared embedding block reads: the generator and discriminator must agree on these.
SHARED_EMBEDDING_FIELDS = (
    "vocab_size", "embed_dim", "max_length", "type_vocab_size", "pad_token_id", "positions_after_padding",
    "dropout_rate", "layer_norm_epsilon", "dtype", "param_dtype",
)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ElectraConfig(EncoderConfig):
    """Hyper-parameters of an ELECTRA generator or discriminator (the fields of `EncoderConfig`).

    embedding_size: width E of the embedding tables when it differs from d_model
    (ELECTRA-small: 128 against 256), projected to d_model; None when equal.
    """

    @property
    def mlm_activation(self) -> str:
        return "gelu_exact"  # HF ElectraGeneratorPredictions uses 'gelu' whatever hidden_act is

    @property
    def classifier_activation(self) -> str | None:
        return "gelu_exact"  # HF ElectraClassificationHead: dense, 'gelu', out_proj on the first token


class ElectraGenerator(MaskedLMEncoder):
    """input_tokens [b, s] (MLM-masked) -> float32 MLM logits [b, s, vocab]."""

    config: ElectraConfig

    def __call__(self, input_tokens: Array, token_type_ids: Array | None = None, enable_dropout: bool = False) -> Array:
        return self.pretraining_logits(input_tokens, token_type_ids, enable_dropout)[0]


class ElectraDiscriminator(PostLNEncoder):
    """input_tokens [b, s] -> float32 replaced-token logits [b, s]."""

    config: ElectraConfig

    def setup(self) -> None:
        super().setup()
        c = self.config
        self.discriminator_head = DiscriminatorHead(c.d_model, c.activation, **dtype_kwargs(c))

    def __call__(self, input_tokens: Array, token_type_ids: Array | None = None, enable_dropout: bool = False) -> Array:
        return self.discriminator_head(self.encode(input_tokens, token_type_ids, enable_dropout))


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ElectraPretrainingConfig(LayerStacks):
    """A generator and a discriminator that share their embeddings (the paper's generator is 1/4 as wide).

    Each has its own layer stack and remat policy; they scan together (both
    `scan_layers` must agree).
    """

    generator: ElectraConfig
    discriminator: ElectraConfig

    def __post_init__(self) -> None:
        for role in ("generator", "discriminator"):
            if not isinstance(getattr(self, role), ElectraConfig):
                raise ValueError(
                    f"ElectraPretrainingConfig.{role} must be an ElectraConfig, got {getattr(self, role)!r}."
                )
        for name in SHARED_EMBEDDING_FIELDS:
            mine, theirs = getattr(self.generator, name), getattr(self.discriminator, name)
            if mine != theirs:
                raise ValueError(
                    f"ElectraPretrainingConfig: generator.{name}={mine!r} but discriminator.{name}={theirs!r}; "
                    "the shared embeddings need them equal (set embedding_size so both tables have one width)."
                )
        if self.generator.scan_layers != self.discriminator.scan_layers:
            raise ValueError(
                f"ElectraPretrainingConfig: generator.scan_layers={self.generator.scan_layers} but "
                f"discriminator.scan_layers={self.discriminator.scan_layers}; the joint model scans both or neither."
            )

    @property
    def scan_layers(self) -> bool:
        return self.generator.scan_layers

    def layer_stacks(self) -> dict[tuple[str, ...], int]:
        return {("generator",): self.generator.layer_groups, ("discriminator",): self.discriminator.layer_groups}

    def with_scan_layers(self, scan_layers: bool) -> ElectraPretrainingConfig:
        return dataclasses.replace(
            self, generator=self.generator.with_scan_layers(scan_layers),
            discriminator=self.discriminator.with_scan_layers(scan_layers),
        )


@flax.struct.dataclass
class ElectraOutput:
    """generator_logits float32 [b, s, vocab]; discriminator_logits float32 [b, s]; is_replaced bool [b, s]."""

    generator_logits: Array
    discriminator_logits: Array
    is_replaced: Array


class ElectraPretraining(nn.Module):
    """Joint ELECTRA pre-training (see the module docstring); apply with rngs={'sample': key}."""

    config: ElectraPretrainingConfig

    def setup(self) -> None:
        c = self.config
        self.embeddings = Embeddings(c.discriminator)
        self.generator = ElectraGenerator(c.generator, shared_embeddings=self.embeddings)
        self.discriminator = ElectraDiscriminator(c.discriminator, shared_embeddings=self.embeddings)

    def __call__(
        self,
        input_tokens: Array,
        target_tokens: Array,
        loss_mask: Array,
        token_type_ids: Array | None = None,
        enable_dropout: bool = False,
    ) -> ElectraOutput:
        """input_tokens, target_tokens, loss_mask (int, 1 = selected for MLM) [b, s] -> ElectraOutput."""
        for name, other in (("target_tokens", target_tokens), ("loss_mask", loss_mask)):
            if other.shape != input_tokens.shape:
                raise ValueError(f"{name} has shape {other.shape} but input_tokens has {input_tokens.shape}.")
        generator_logits = self.generator(input_tokens, token_type_ids, enable_dropout)  # [b, s, vocab]
        corrupted = self.corrupt(generator_logits, target_tokens, loss_mask)  # [b, s]
        discriminator_logits = self.discriminator(corrupted, token_type_ids, enable_dropout)  # [b, s]
        return ElectraOutput(generator_logits, discriminator_logits, corrupted != target_tokens)

    def corrupt(self, generator_logits: Array, target_tokens: Array, loss_mask: Array) -> Array:
        """Samples [b, s] at loss_mask positions (not on padding), the target token elsewhere."""
        pad = self.config.discriminator.pad_token_id
        logits = jax.lax.stop_gradient(generator_logits).at[..., pad].set(-jnp.inf)
        sampled = jax.random.categorical(self.make_rng("sample"), logits, axis=-1).astype(target_tokens.dtype)
        replace = loss_mask.astype(bool) & (target_tokens != pad)
        return jnp.where(replace, sampled, target_tokens)
