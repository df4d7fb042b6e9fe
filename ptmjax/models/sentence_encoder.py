"""A sentence encoder: an encoder of the BERT family (BERT, RoBERTa, ALBERT, ELECTRA) that pools its final hidden
states into one vector per text, as a sentence-transformers folder does, for contrastive training.

`sentence_encoder(model, pooling, normalize)` returns `model` as a subclass of its own class and of
`SentenceEncoder` (one class per base class): its parameters are exactly the model's (at init it also runs the
model's own `__call__`, so its pre-training heads exist, untouched by the pooled loss), so an import or a run
restores into it by path and `encoder_of` gives back the model, which Hugging Face export writes. `__call__`
embeds 'input_tokens' (anchors) and 'positive_tokens' (their positives) -> `PairEmbeddings`; `encode` stays
the model's, so `ptmjax.load` reads hidden states and embeddings as it does for the model.

Pooling is sentence-transformers' `Pooling` over the real (non-padding) tokens, special tokens included:
'mean' their mean, 'cls' the first token, 'max' the elementwise maximum; `normalize` divides by the L2 norm
(at least 1e-12, as torch's `normalize`).
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from ptmjax.models.encoder import PostLNEncoder

Array = jax.Array
POOLINGS = ("mean", "cls", "max")  # sentence-transformers' pooling modes
NORM_EPSILON = 1e-12


@flax.struct.dataclass
class PairEmbeddings:
    """anchors, positives: float32 [b, d_model], row i of each one pair."""

    anchors: Array
    positives: Array


def pooled(hidden: Array, real: Array, pooling: str, normalize: bool) -> Array:
    """hidden [b, s, d], real [b, s] (bool: not padding) -> float32 [b, d] pooled as the module doc says."""
    hidden, real = hidden.astype(jnp.float32), real[..., None]
    if pooling == "mean":
        vectors = jnp.sum(hidden * real, axis=1) / jnp.maximum(jnp.sum(real, axis=1), 1)
    elif pooling == "cls":
        vectors = hidden[:, 0]
    else:
        vectors = jnp.max(jnp.where(real, hidden, -jnp.inf), axis=1)
    if normalize:
        vectors = vectors / jnp.maximum(jnp.linalg.norm(vectors, axis=-1, keepdims=True), NORM_EPSILON)
    return vectors


class SentenceEncoder(nn.Module):
    """What `sentence_encoder` adds to an encoder class (see the module doc); its fields `pooling` and
    `normalize` come with the subclass."""

    def __call__(self, input_tokens: Array, positive_tokens: Array, enable_dropout: bool = False) -> PairEmbeddings:
        if self.is_initializing():
            super().__call__(input_tokens)  # the model's own parameters, heads included
        return PairEmbeddings(self.embed(input_tokens, enable_dropout), self.embed(positive_tokens, enable_dropout))

    def embed(self, input_tokens: Array, enable_dropout: bool = False) -> Array:
        """input_tokens [b, s] -> float32 [b, d_model]: the pooled final hidden states."""
        hidden = self.encode(input_tokens, None, enable_dropout)
        return pooled(hidden, input_tokens != self.config.pad_token_id, self.pooling, self.normalize)


def sentence_encoder(model: nn.Module, pooling: str = "mean", normalize: bool = False) -> nn.Module:
    """`model` (an encoder of the BERT family) pooling as sentence-transformers does (module doc)."""
    if not isinstance(model, PostLNEncoder) or isinstance(model, SentenceEncoder):
        raise ValueError(f"a sentence encoder wraps an encoder of the BERT family once (BERT, RoBERTa, ALBERT, "
                         f"ELECTRA), got {type(model).__name__}; e.g. sentence_encoder.model = @Bert()")
    if pooling not in POOLINGS:
        raise ValueError(f"pooling={pooling!r} is unknown; use one of {', '.join(POOLINGS)}")
    fields = {name: getattr(model, name) for name in _field_names(type(model))}
    return _sentence_class(type(model))(**fields, pooling=pooling, normalize=bool(normalize))


def encoder_of(model: nn.Module) -> nn.Module:
    """The encoder a `sentence_encoder` model wraps (with the same parameters); any other model as it is."""
    if not isinstance(model, SentenceEncoder):
        return model
    base = type(model).__bases__[1]
    return base(**{name: getattr(model, name) for name in _field_names(base)})


def _field_names(cls: type[nn.Module]) -> list[str]:
    return [f.name for f in cls.__dataclass_fields__.values() if f.init and f.name not in ("parent", "name")]


@functools.cache
def _sentence_class(base: type[nn.Module]) -> type[nn.Module]:
    """`SentenceEncoder` over `base` with the pooling fields (one class per base, so equal models compare equal)."""
    namespace = {
        "__module__": __name__, "__annotations__": {"pooling": str, "normalize": bool},
        "pooling": dataclasses.field(kw_only=True), "normalize": dataclasses.field(kw_only=True),
    }
    return type(f"Sentence{base.__name__}", (SentenceEncoder, base), namespace)
