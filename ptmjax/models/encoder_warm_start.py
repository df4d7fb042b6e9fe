"""An encoder-decoder warm-started from a pre-trained post-LN encoder (BERT, RoBERTa's shape, XLM).

XLM (Lample & Conneau, 2019) and Rothe et al. (2020, "BERT2BERT") initialise a translation model's encoder
and decoder from one pre-trained encoder: the decoder's self-attention and feed-forward, their layer norms
and the embeddings are copied from the encoder's layers, and only the cross-attention (with its layer norm)
is new. BART's post-LN layers are the encoder's layers with the same parameter names
(`attention`, `attention_layer_norm`, `mlp`, `mlp_layer_norm`; a decoder layer's `self_attention` is the
encoder layer's `attention`), so the encoder-decoder here is `Bart` with the encoder's sizes:

* the token table is shared by both stacks and the output (tied, as the encoder's MLM head is);
* BART adds no token-type or language embedding, so the encoder's token-type row 0 and the language row of
  each stack's language (XLM's language embedding: the source language on the encoder, the target language
  on the decoder) are added into each stack's position table: BART's row p + 2 = position p + type 0 +
  language, which gives the embedding sums the encoder computes (up to float rounding of the order of the
  sum); BART's rows 0 and 1 (never read) stay as initialised;
* the embedding LayerNorm is the encoder's on both stacks; `final_logits_bias` is the MLM head's output bias
  (the MLM head's transform and its LayerNorm have no place in BART and are left out).

With those, `Bart.encode` of the warm-started parameters equals the encoder's final hidden states for a text
read in the source language (tests/models/test_encoder_warm_start.py).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from ptmjax.models.bart import POSITION_OFFSET, BartConfig
from ptmjax.models.encoder import EncoderConfig

COPIED_LAYER_PARTS = {  # a BART decoder layer's module -> the encoder layer's module it starts from
    "self_attention": "attention", "self_attention_layer_norm": "attention_layer_norm",
    "mlp": "mlp", "mlp_layer_norm": "mlp_layer_norm",
}


def warm_start_config(config: EncoderConfig, num_decoder_layers: int | None = None) -> BartConfig:
    """The `BartConfig` of the encoder's sizes (post-LN, no embedding scale, its epsilon and pad id); the
    decoder has `num_decoder_layers` layers (None: as many as the encoder; fewer copy the first ones)."""
    unsupported = {"embedding_size": config.embedding_size, "num_layer_groups": config.num_layer_groups,
                   "positions_after_padding": config.positions_after_padding, "scan_layers": config.scan_layers}
    kept = {name: value for name, value in unsupported.items() if value not in (None, False)}
    if kept:
        raise ValueError(f"warm_start_config: {type(config).__name__} has {kept}, which BART's layers cannot take; "
                         "warm-start from an unscanned BERT-shaped encoder (no factorised embedding, no shared "
                         "layers, BERT's positions)")
    decoder_layers = config.num_layers if num_decoder_layers is None else num_decoder_layers
    if not 1 <= decoder_layers <= config.num_layers:
        raise ValueError(f"warm_start_config: num_decoder_layers={num_decoder_layers} must be 1 to the encoder's "
                         f"{config.num_layers} layers, each copied from the encoder layer of its index")
    return BartConfig(
        config.vocab_size, config.d_model, config.num_heads, config.num_layers, decoder_layers, config.d_ff,
        max_length=config.max_length, pad_token_id=config.pad_token_id, activation=config.activation,
        dropout_rate=config.dropout_rate, attention_dropout_rate=config.attention_dropout_rate,
        layer_norm_epsilon=config.layer_norm_epsilon, dtype=config.dtype, param_dtype=config.param_dtype,
        attention_kernel=config.attention_kernel,
    )


def _position_table(embeddings: dict[str, Any], fresh: jnp.ndarray, language_id: int) -> jnp.ndarray:
    """BART's position table: rows p + 2 = the encoder's position p + token type 0 + language `language_id`."""
    added = embeddings["position_embedder"]["embedding"]
    if "token_type_embedder" in embeddings:
        added = added + embeddings["token_type_embedder"]["embedding"][0]
    if "language_embedder" in embeddings:
        languages = embeddings["language_embedder"]["embedding"]
        if not 0 <= language_id < len(languages):
            raise ValueError(f"warm_start_params: language id {language_id} is outside the encoder's "
                             f"{len(languages)} languages; pass one of 0..{len(languages) - 1}")
        added = added + languages[language_id]
    elif language_id:
        raise ValueError(f"warm_start_params: language id {language_id} given but the encoder has no language "
                         "embedding (num_languages=0); pass 0")
    return jnp.asarray(fresh).at[POSITION_OFFSET:].set(jnp.asarray(added, fresh.dtype))


def warm_start_params(encoder_params: dict[str, Any], fresh_params: dict[str, Any], source_language_id: int = 0,
                      target_language_id: int = 0) -> dict[str, Any]:
    """`Bart` parameters (of `warm_start_config`) from an encoder's: `fresh_params` (a `Bart.init` of that
    config, unboxed) with every part but the decoder's cross-attention replaced as the module doc says."""
    embeddings = encoder_params["embeddings"]
    norm = embeddings["layer_norm"]
    params = {**fresh_params, "token_embedder": embeddings["token_embedder"]}
    for stack, language_id in (("encoder", source_language_id), ("decoder", target_language_id)):
        fresh = fresh_params[stack]
        layers = {}
        for name, fresh_layer in fresh.items():
            if not name.startswith("layers_"):
                continue
            source = encoder_params[name]
            layers[name] = (source if stack == "encoder" else
                            {**fresh_layer, **{part: source[copied] for part, copied in COPIED_LAYER_PARTS.items()}})
        table = _position_table(embeddings, fresh["position_embedder"]["embedding"], language_id)
        params[stack] = {**fresh, **layers, "embedding_layer_norm": norm, "position_embedder": {"embedding": table}}
    if "mlm_head" in encoder_params:
        params["final_logits_bias"] = encoder_params["mlm_head"]["bias"]
    return params
