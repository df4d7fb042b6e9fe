"""SpanBERT's pre-training task over the embedded stdlib corpus; importing this module registers it:

* 'ptmjax_stdlib_spanbert': `masked_lm.bert_mlm` with SpanBERT's masking (15% of the tokens in whole-word
  spans of Geometric(0.2) length, at most 10 words; 80/10/10) and the span boundary features
  (ptmjax/objectives/span_boundaries.py): 'inputs', 'targets', 'loss_mask', 'span_left', 'span_right',
  'span_position'. For `ptmjax.models.SpanBert` (`gin_configs/runs/spanbert_demo.gin`).
"""

from __future__ import annotations

import functools

import seqio

from ptmjax.data import corpus, vocabularies
from ptmjax.objectives import masked_lm
from ptmjax.tasks import registry

SPAN_BERT_TASK = "ptmjax_stdlib_spanbert"
SPAN_BERT_MASKING = masked_lm.MaskedLMOptions(masking="span", span_boundaries=True)


def register_span_bert_task(vocabulary: seqio.Vocabulary | None = None) -> seqio.Task:
    """(Re-)registers 'ptmjax_stdlib_spanbert' (vocabulary: the stdlib SentencePiece one, whose pieces mark words)."""
    source = seqio.FunctionDataSource(corpus.stdlib_dataset_fn, splits=corpus.SPLITS)
    objective = functools.partial(masked_lm.bert_mlm, options=SPAN_BERT_MASKING)
    return registry.register_task(
        SPAN_BERT_TASK, source, registry.objective_preprocessors(objective, append_eos=False),  # bert_mlm adds EOS
        vocabulary or vocabularies.stdlib_sentencepiece_vocabulary(),
    )


register_span_bert_task()
