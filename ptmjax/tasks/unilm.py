"""UniLM's pre-training tasks over the embedded stdlib corpus, one per attention mask, and their mixture.

Importing this module registers, with the stdlib SentencePiece vocabulary (for `ptmjax.models.UniLM`,
`gin_configs/runs/unilm_demo.gin`):

* 'ptmjax_stdlib_unilm_<mask>' for each mask of `UNILM_MASKS` (bidirectional, left_to_right, right_to_left,
  sequence_to_sequence): `objectives.unilm.unilm_cloze` under that mask. Each is scored on its validation
  split by `masked_token_loss`: the mean negative log-likelihood of its masked tokens, so an evaluation of
  the mixture (`train.inference_eval_tasks`) reports one loss per mask ('eval_<task>/loss');
* 'ptmjax_stdlib_unilm': their mixture at the paper's rates: bidirectional and sequence-to-sequence 1/3
  each, left-to-right and right-to-left 1/6 each (Dong et al., 2019, section 2.3).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import seqio

from ptmjax.data import corpus, vocabularies
from ptmjax.models.unilm import UNILM_MASKS
from ptmjax.objectives import unilm
from ptmjax.tasks import registry

UNILM_MIXTURE = "ptmjax_stdlib_unilm"
UNILM_RATES = {"bidirectional": 1 / 3, "left_to_right": 1 / 6, "right_to_left": 1 / 6, "sequence_to_sequence": 1 / 3}


def task_name(mask: str) -> str:
    """The registered task of UniLM mask `mask`."""
    return f"ptmjax_stdlib_unilm_{mask}"


def masked_token_count(target: Any, example: Mapping[str, np.ndarray] | None = None, is_target: bool = False) -> Any:
    """seqio postprocessor: an example's target becomes its number of masked ('loss_mask') tokens, what a
    masked LM's score sums over; predictions pass unchanged."""
    return int(np.sum(example["loss_mask"])) if is_target else target


def masked_token_loss(targets: Sequence[int], scores: Sequence[float]) -> dict[str, float]:
    """A score metric: {'loss': -sum(scores) / sum(targets)}, the mean negative log-likelihood of the masked
    tokens, with targets the examples' masked-token counts (`masked_token_count`) and scores their summed
    log-likelihoods (`ModelApi.score` of a masked LM)."""
    if len(targets) != len(scores):
        raise ValueError(f"masked_token_loss got {len(targets)} targets but {len(scores)} scores")
    return {"loss": -float(np.sum(scores)) / max(int(np.sum(targets)), 1)}


def unilm_features(vocabulary: seqio.Vocabulary) -> dict[str, seqio.Feature]:
    """'inputs' and 'targets' of `vocabulary`, and the int32 sequences a mixture must keep: 'loss_mask',
    'token_type_ids', 'lm_mask_kind'."""
    ids = seqio.PassThroughVocabulary(len(UNILM_MASKS))
    extra = {key: seqio.Feature(ids, add_eos=False) for key in ("loss_mask", "token_type_ids", unilm.MASK_KIND_KEY)}
    return {**registry.output_features(vocabulary), **extra}


def register_unilm_tasks(vocabulary: seqio.Vocabulary | None = None) -> seqio.Mixture:
    """(Re-)registers the four tasks and the mixture listed in the module doc."""
    vocabulary = vocabulary or vocabularies.stdlib_sentencepiece_vocabulary()
    source = seqio.FunctionDataSource(corpus.stdlib_dataset_fn, splits=corpus.SPLITS)
    for mask in UNILM_MASKS:
        objective = functools.partial(unilm.unilm_cloze, mask=mask)
        registry.register_task(
            task_name(mask), source, registry.objective_preprocessors(objective, append_eos=False),  # EOS: bert_mlm
            vocabulary, metric_fns=[masked_token_loss], postprocess_fn=masked_token_count,
            features=unilm_features(vocabulary),
        )
    return registry.register_mixture(UNILM_MIXTURE, [(task_name(mask), UNILM_RATES[mask]) for mask in UNILM_MASKS])


register_unilm_tasks()
