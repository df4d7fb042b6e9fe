"""Contrastive fine-tuning of a sentence-transformers model: `train.model = @sentence_encoder()`.

`sentence_encoder(model, folder)` is `models.sentence_encoder.sentence_encoder` with the pooling and
normalisation a sentence-transformers folder declares (its modules.json, 1_Pooling/config.json and
2_Normalize/: an imported folder, or a run trained from one, which keeps the files), so the encoder trains as
it embeds. Its family (families/registry.py) reads anchor and positive rows (`ptmjax_stdlib_docstring_pairs`),
minimises the MultipleNegativesRanking loss with in-batch negatives (families/losses.py) and predicts
embeddings for `metrics.retrieval_at_1`; the trained folder embeds with `ptmjax.load(...).embed` and exports
as the wrapped model, the sentence-transformers files beside it.
"""

from __future__ import annotations

from flax import linen as nn

from ptmjax.data.sentence_pooling import read_pooling
from ptmjax.models import sentence_encoder as encoders


def sentence_encoder(model: nn.Module, folder: str) -> nn.Module:
    """`model` pooling and normalising as the sentence-transformers files of `folder` say."""
    pooling = read_pooling(folder)
    if pooling is None:
        raise ValueError(f"{folder} has no modules.json of sentence-transformers; point sentence_encoder.folder at "
                         "a sentence-transformers folder, its `ptmjax convert` import or a run trained from one")
    return encoders.sentence_encoder(model, pooling.pooling, pooling.normalize)
