"""Where each family's token ids enter and its layer stacks run: the module methods prompt and prefix tuning hook.

`ENTRIES` (prompt tuning): the methods that take a stack's token ids, before
any mask, position or length is derived from them (T5's encoder and
decoder, BART's `encode` and `decoder_hidden_states`, GPT-2's
`hidden_states`, the BERT family's `encode`). `STACKS` (prefix tuning): the
compact methods that embed the ids and call `apply_layers`, so parameters
created in their scope sit beside the stack's layers and exist before any
layer runs. They are the same method except in BART, whose masks are
built by the model and whose stacks are `BartStack`s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import flax.linen as nn

from ptmjax.layers.embed import Embed
from ptmjax.models import bart, encoder, gpt2, t5


class Entry(NamedTuple):
    """A family's method where token ids enter: the ids argument, how its per-token companions grow, the
    token embedder and padding id of its module (None: the ids only grow, the prompt enters elsewhere), and
    whether the method's outputs at the prompt are dropped."""

    tokens: str
    companions: dict[str, str]  # argument: 'first' (the row's first value), 'zeros' or 'positions'
    embedder: Callable[[nn.Module], Embed] | None
    pad_id: Callable[[nn.Module], int]
    drops_prompt: bool


ENTRIES: dict[tuple[type, str], Entry] = {
    (t5.Encoder, "__call__"): Entry(
        "tokens", {"segment_ids": "first", "positions": "positions"}, lambda m: m.shared_embedding, lambda m: 0,
        False,
    ),
    (t5.Decoder, "__call__"): Entry("encoder_tokens", {"encoder_segment_ids": "first"}, None, lambda m: 0, False),
    (gpt2.GPT2, "hidden_states"): Entry(
        "decoder_input_tokens",
        {"decoder_segment_ids": "first", "decoder_positions": "positions", "decoder_causal_attention": "zeros"},
        lambda m: m.token_embedder, lambda m: -1, True,
    ),
    (encoder.PostLNEncoder, "encode"): Entry(
        "input_tokens", {"token_type_ids": "zeros"}, lambda m: m.embeddings.token_embedder,
        lambda m: m.config.pad_token_id, True,
    ),
    (bart.Bart, "encode"): Entry(
        "encoder_input_tokens", {"encoder_segment_ids": "first", "encoder_positions": "positions"},
        lambda m: m.token_embedder, lambda m: m.config.pad_token_id, False,
    ),
    (bart.Bart, "decoder_hidden_states"): Entry(
        "encoder_input_tokens", {"encoder_segment_ids": "first"}, None, lambda m: m.config.pad_token_id, False,
    ),
}

STACKS: tuple[tuple[type, str], ...] = (
    (t5.Encoder, "__call__"), (t5.Decoder, "__call__"), (gpt2.GPT2, "hidden_states"),
    (encoder.PostLNEncoder, "encode"), (bart.BartStack, "__call__"),
)


def entry_of(module: nn.Module, method: str) -> Entry | None:
    """The entry `module.method` is, or None."""
    return next((e for (cls, name), e in ENTRIES.items() if name == method and isinstance(module, cls)), None)


def runs_stack(module: nn.Module, method: str) -> bool:
    """Whether `module.method` is one of `STACKS`."""
    return any(name == method and isinstance(module, cls) for cls, name in STACKS)
