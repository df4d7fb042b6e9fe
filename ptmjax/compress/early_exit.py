"""Early exit (DeeBERT, Xin et al., 2020; PABEE, Zhou et al., 2020): a sequence classifier after every layer.

`early_exit(model)` returns a sequence-classification model of the encoder family (BERT, RoBERTa,
ALBERT, ELECTRA) with an exit classifier after each of its L layers (each use of an ALBERT shared
layer counts): L - 1 new ones, `exits_{i}` after layer i + 1, each of the architecture of the
model's own head (BERT, ALBERT: the tanh pooler, dropout and a linear classifier; RoBERTa, ELECTRA:
dense, activation and `out_proj` on the first token) at that head's paths under `exits_{i}/`, and
the model's head itself after the last layer. `exit_logits(...)` gives every exit's float32 logits
[L, b, num_labels]; `__call__` gives the last one's, so the head evaluator, `ptmjax eval` and
`ptmjax.load` read the model as its plain classifier (a threshold of 0). `EXIT_PARAMS` matches the
new exits' parameter paths, for `train.trainable` (DeeBERT's second stage).

Why a subclass of the model's own class, made by `early_exit` (one class per base class, as
ptmjax/adapt/interception.py makes them), rather than an interception settings type or a family
of its own: the exits are whole modules with their own parameters, which a subclass's `setup`
builds from the head modules (an interceptor could only add raw parameters inside existing
modules), and the family record stays the classifier's, so the trainer, the head evaluator, the
partitioning rules and a pre-trained or fine-tuned checkpoint (restored by path; only the exits are
new) see the model they know. The layer outputs are read as the probing tools read them
(`recorded_layer_calls`): the state after layer i is layer i + 1's input, so a layer LayerDrop skips
hands its input on. What the exits are trained on is `early_exit_loss.ExitLoss`; when to leave is
`early_exit_policies`. Scanned and rematerialised layers are refused; GPT-2's and T5's heads are not served (GPT-2's
intermediate states come before its final norm, so its head would not fit them).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.adapt.probing.layer_features import probed_stack, recorded_layer_calls, stack_depth
from ptmjax.families.family import Kind
from ptmjax.families.head_predictions import class_ids
from ptmjax.families.registry import family_of
from ptmjax.layers import layer_stack
from ptmjax.layers.common import dtype_kwargs
from ptmjax.layers.dense import Dense
from ptmjax.models.task_heads import CLASS_AXES, FirstTokenClassifier, FirstTokenPooler

Array = jax.Array

EXIT_PARAMS = r"exits_\d+/.*"  # the new exits' parameters (unboxed paths), e.g. 'exits_0/classifier/kernel'


class ExitClassifier(nn.Module):
    """One exit: the model's head architecture (see the module doc), hidden [b, s, d_model] -> float32 [b, C]."""

    config: Any
    num_labels: int
    dropout_rate: float

    def setup(self) -> None:
        c, kw = self.config, dtype_kwargs(self.config)
        if c.classifier_activation is None:
            self.pair_head = FirstTokenPooler(c.d_model, **kw)
            self.dropout = nn.Dropout(self.dropout_rate)
            self.classifier = Dense((self.num_labels,), CLASS_AXES, use_bias=True, **kw)
        else:
            self.classifier = FirstTokenClassifier(
                c.d_model, self.num_labels, c.classifier_activation, self.dropout_rate, **kw
            )

    def __call__(self, hidden: Array, enable_dropout: bool = False) -> Array:
        if self.config.classifier_activation is not None:
            return self.classifier(hidden, enable_dropout)
        pooled = self.dropout(self.pair_head(hidden), deterministic=not enable_dropout)
        return self.classifier(pooled).astype(jnp.float32)


def early_exit(model: nn.Module) -> nn.Module:
    """`model` (an encoder-family sequence classifier) with an exit classifier after every layer."""
    check_exit_base(model)
    if has_exits(model):
        raise ValueError(f"{type(model).__name__} already has exits; apply early_exit to the classifier once.")
    names = [f.name for f in dataclasses.fields(model) if f.init and f.name not in ("parent", "name")]
    return _exit_class(type(model))(**{name: getattr(model, name) for name in names})


def check_exit_base(model: nn.Module) -> None:
    """Raise in one line unless `model` is an encoder-family sequence classifier (two or more labels) with plain
    layers (not scanned, not rematerialised)."""
    if not is_encoder_classifier(model):
        raise ValueError(
            f"early exit needs a sequence classifier of the encoder family (BERT, RoBERTa, ALBERT, ELECTRA) with "
            f"num_labels >= 2, got {type(model).__name__}; e.g. early_exit.model = @EncoderForSequenceClassification()"
        )
    config = type(model.config).__name__
    if layer_stack.scanning_config(model) is not None:
        raise ValueError(f"early exit reads every layer's output, which a scanned stack hides; set "
                         f"{config}.scan_layers = False.")
    if model.config.remat_policy != "none":
        raise ValueError(f"early exit reads every layer's output, which remat_policy={model.config.remat_policy!r} "
                         f"recomputes out of its reach; set {config}.remat_policy = 'none'.")


def is_encoder_classifier(model: Any) -> bool:
    """Whether `model` is a sequence classifier of the encoder family (BERT, RoBERTa, ALBERT, ELECTRA) predicting
    class ids (num_labels >= 2): the models early exit and PoWER-BERT (token_dropping.py) serve."""
    family = family_of(model) if isinstance(model, nn.Module) else None
    return (family is not None and family.task_head == "SequenceClassification" and family.kind is Kind.ENCODER
            and family.head_predictions is class_ids)


def has_exits(model: nn.Module) -> bool:
    """Whether `model` is an `early_exit` model."""
    return callable(getattr(model, "exit_logits", None))


def check_exit_model(model: nn.Module, user: str) -> None:
    """Raise in one line, naming `user` (what needs the exits), unless `model` is an `early_exit` model."""
    if not has_exits(model):
        raise ValueError(
            f"{user} needs a model with exits, got {type(model).__name__}; wrap it: "
            "train.model = @early_exit() and early_exit.model = @EncoderForSequenceClassification()"
        )


def exit_depth(model: nn.Module) -> int:
    """L: the exits of an `early_exit` model, one per layer applied."""
    return stack_depth(model)


@functools.cache
def _exit_class(base: type[nn.Module]) -> type[nn.Module]:
    """`base` with the exits (one class per base, so equal models compare equal)."""

    def setup(self: nn.Module) -> None:
        base.setup(self)
        rate, config = self.head_dropout_rate, self.config
        self.exits = [ExitClassifier(config, self.num_labels, rate) for _ in range(exit_depth(self) - 1)]

    def call(self: nn.Module, input_tokens: Array, token_type_ids: Array | None = None,
             enable_dropout: bool = False) -> Array:
        """float32 logits [b, num_labels] of the last exit (the model's head); builds every exit at init."""
        return self.exit_logits(input_tokens, token_type_ids, enable_dropout)[-1]

    def exit_logits(self: nn.Module, input_tokens: Array, token_type_ids: Array | None = None,
                    enable_dropout: bool = False) -> Array:
        """float32 logits [L, b, num_labels]: exit i's on the state after layer i + 1; the last is the head's."""
        with recorded_layer_calls(probed_stack(self)) as calls:
            final = self.encode(input_tokens, token_type_ids, enable_dropout)
        states = [layer_input for layer_input, _ in calls[1:]]
        logits = [head(state, enable_dropout) for head, state in zip(self.exits, states, strict=True)]
        return jnp.stack([*logits, self.classify(final, enable_dropout)])

    def exit_at(self: nn.Module, index: int, hidden: Array) -> Array:
        """Exit `index`'s (0-based) float32 logits [b, num_labels] on hidden [b, s, d_model]; no dropout."""
        return self.classify(hidden) if index == exit_depth(self) - 1 else self.exits[index](hidden)

    namespace = {"__module__": __name__, "setup": setup, "__call__": call, "exit_logits": exit_logits,
                 "exit_at": exit_at}
    return type(f"EarlyExit{base.__name__}", (base,), namespace)
