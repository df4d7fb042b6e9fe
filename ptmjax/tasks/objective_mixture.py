"""Encoder-decoder tasks over the embedded stdlib corpus, one per text-to-text objective, and their mixture.

Importing this module registers, with the stdlib SentencePiece vocabulary and
'inputs'/'targets' features that end with EOS (`registry.output_features`):

* 'ptmjax_stdlib_ul2': UL2's mixture of denoisers (`objectives.ul2.ul2`);
* 'ptmjax_stdlib_pegasus': PEGASUS gap sentences (`objectives.pegasus.pegasus`);
* 'ptmjax_stdlib_mass': MASS (`objectives.mass.mass`; its targets length must
  be at least half the inputs length);
* 'ptmjax_stdlib_bart_denoising': BART's setting of `objectives.bart_noising`
  (its defaults: sentence permutation and text infilling of 30% of the tokens
  in Poisson(3) spans);
* 'ptmjax_stdlib_prefix_lm': prefix LM (`objectives.language_modeling.prefix_lm`);
* 'ptmjax_stdlib_bert_style': the T5 paper's 'BERT-style' objective (`bert_style`):
  inputs = the text with BERT's masking (15% selected; 80% mask, 10% random,
  10% unchanged), targets = the whole original text; its targets length must
  be at least its inputs length;
* 'ptmjax_objective_mixture': T5 span corruption ('ptmjax_stdlib_span_corruption'),
  UL2, BART denoising and PEGASUS, equally often.

The objectives are gin-configurable: `ptmjax.objectives.ul2.Ul2Options.rates = [...]`
in a gin file changes the task. `gin_configs/runs/objective_mixture.gin`
pre-trains the tiny T5 on the mixture.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import seqio
import tensorflow as tf

from ptmjax.data import corpus, vocabularies
from ptmjax.objectives import bart_noising, common, language_modeling, masked_lm, mass, pegasus, ul2
from ptmjax.tasks import pretraining, registry

UL2_TASK = "ptmjax_stdlib_ul2"
PEGASUS_TASK = "ptmjax_stdlib_pegasus"
MASS_TASK = "ptmjax_stdlib_mass"
BART_TASK = "ptmjax_stdlib_bart_denoising"
PREFIX_LM_TASK = "ptmjax_stdlib_prefix_lm"
BERT_STYLE_TASK = "ptmjax_stdlib_bert_style"
OBJECTIVE_MIXTURE = "ptmjax_objective_mixture"
OBJECTIVES: dict[str, Callable] = {
    UL2_TASK: ul2.ul2,
    PEGASUS_TASK: pegasus.pegasus,
    MASS_TASK: mass.mass,
    BART_TASK: bart_noising.bart_noising,
    PREFIX_LM_TASK: language_modeling.prefix_lm,
}
MIXTURE_TASKS = (pretraining.STDLIB_TASK, UL2_TASK, BART_TASK, PEGASUS_TASK)


def bert_style(
    dataset: tf.data.Dataset, sequence_length: Mapping[str, int], output_features: Mapping[str, seqio.Feature]
) -> tf.data.Dataset:
    """T5's 'BERT-style' text-to-text objective: `masked_lm.bert_mlm` without its loss mask.

    {'targets': tokenised text} -> {'inputs': masked pieces, 'targets': the same pieces unmasked}, both of
    sequence_length['inputs'] tokens with EOS (appended by `bert_mlm`, so add no `append_eos_after_trim`).
    """
    inputs_length = common.required_length(sequence_length, "inputs", "bert_style")
    targets_length = sequence_length.get("targets")
    if targets_length is not None and targets_length < inputs_length:
        raise ValueError(
            f"bert_style predicts the whole input: targets length {targets_length} must be at least the inputs "
            f"length {inputs_length}; set task_feature_lengths['targets'] >= {inputs_length}"
        )
    dataset = masked_lm.bert_mlm(dataset, sequence_length, output_features)
    return dataset.map(lambda features: {"inputs": features["inputs"], "targets": features["targets"]})


def register_objective_tasks(vocabulary: seqio.Vocabulary | None = None) -> None:
    """(Re-)registers the tasks and the mixture listed in the module doc.

    vocabulary: defaults to the stdlib SentencePiece vocabulary; the mixture
    needs the one of 'ptmjax_stdlib_span_corruption'.
    """
    vocabulary = vocabulary or vocabularies.stdlib_sentencepiece_vocabulary()
    source = seqio.FunctionDataSource(corpus.stdlib_dataset_fn, splits=corpus.SPLITS)
    for name, objective in OBJECTIVES.items():
        registry.register_task(name, source, registry.objective_preprocessors(objective), vocabulary)
    bert_style_preprocessors = registry.objective_preprocessors(bert_style, append_eos=False)  # bert_mlm adds EOS
    registry.register_task(BERT_STYLE_TASK, source, bert_style_preprocessors, vocabulary)
    registry.register_mixture(OBJECTIVE_MIXTURE, [(task, 1.0) for task in MIXTURE_TASKS])


register_objective_tasks()
