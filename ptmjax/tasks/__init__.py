"""Seqio tasks and mixtures: every ptmjax task is registered here, through `registry.py`.

`pretraining.py` the built-in pre-training tasks over the embedded corpus (and local text files, C4),
`objective_mixture.py` the objectives compared by the experiments, `mixtures.py` temperature-sampled mixtures;
downstream tasks over the embedded corpus: `module_classification.py` (text-to-text and ranked),
`classification_head.py`, `tagging.py`, `question_answering.py` (task heads), `summaries.py` (generative);
`benchmarks/` GLUE, SuperGLUE, SQuAD, summarization and translation over TFDS data a user prepares;
`text_to_text.py` what the text-to-text tasks share. A task's metrics come from `ptmjax.metrics`.
"""
