"""What the trainer needs to know about each model family, and nothing more.

A family is named by its Flax module class. It decides which seqio feature
converter turns task features into model features, and which of those
features initialise the parameters. The train step itself is family-free:
it passes every non-target feature to the model by name.
"""

from __future__ import annotations

import dataclasses

import seqio
from flax import linen as nn

from ptmjax.models import GPT2, EncoderDecoder


@dataclasses.dataclass(frozen=True)
class Architecture:
    """How batches are built for a model family.

    Attributes:
      feature_converter: the seqio converter class (constructed with `pack=`).
      init_fields: the model inputs that `model.init` needs, as [batch, length] ints.
    """

    feature_converter: type[seqio.FeatureConverter]
    init_fields: tuple[str, ...]


ARCHITECTURES: dict[type[nn.Module], Architecture] = {
    EncoderDecoder: Architecture(seqio.EncDecFeatureConverter, ("encoder_input_tokens", "decoder_input_tokens")),
    # Handles causal LM ('targets' only) and prefix LM ('inputs' + 'targets').
    GPT2: Architecture(seqio.DecoderFeatureConverter, ("decoder_input_tokens",)),
}


def architecture_of(model: nn.Module) -> Architecture:
    """The registered architecture of `model`'s class; names the known ones if none."""
    for cls in type(model).__mro__:
        if cls in ARCHITECTURES:
            return ARCHITECTURES[cls]
    known = ", ".join(sorted(cls.__name__ for cls in ARCHITECTURES))
    raise ValueError(
        f"the trainer does not know model class {type(model).__name__}; known: {known}. "
        "Add it to ptmjax.training.architectures.ARCHITECTURES"
    )
