"""Zero- and few-shot prompting of decoders: k solved examples before the query, scored by rank classification.

`few_shot_prompt` writes k demonstrations with the `demonstration` template
('{text}', '{label}') and then the query with its label left empty (GPT-3
style in-context learning, Brown et al. 2020); k = 0 is zero-shot. The
demonstrations are drawn from the train split with a seed, the same for
every query, so a result is reproducible. `few_shot_accuracy` scores each
class's verbalised label after the prompt
(`rank_classification.candidate_log_likelihoods`, read causally by a
decoder-only model) and predicts the most likely one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import seqio
from flax import linen as nn

from ptmjax.evaluation import rank_classification

DEMONSTRATION = "{text}\nAnswer: {label}\n\n"


def few_shot_prompt(
    demonstrations: Sequence[tuple[str, str]], query: str, template: str = DEMONSTRATION,
) -> str:
    """The demonstrations' (text, label) filled into `template`, then the query's text with the label cut off."""
    if "{text}" not in template or not template.split("{text}", 1)[1].count("{label}"):
        raise ValueError(f"demonstration template {template!r} needs '{{text}}' followed by '{{label}}'")
    solved = "".join(template.format(text=text, label=label) for text, label in demonstrations)
    return solved + template.split("{label}")[0].format(text=query)


def draw_demonstrations(examples: Sequence[tuple[str, int]], k: int, seed: int) -> list[tuple[str, int]]:
    """k training examples drawn without replacement, in a seeded order."""
    if not 0 <= k <= len(examples):
        raise ValueError(f"k={k} demonstrations cannot be drawn from {len(examples)} training examples")
    order = np.random.default_rng(seed).permutation(len(examples))[:k]
    return [examples[i] for i in order]


def few_shot_accuracy(
    model: nn.Module, params: Any, vocabulary: seqio.Vocabulary, train: Sequence[tuple[str, int]],
    queries: Sequence[tuple[str, int]], labels: Sequence[str], k: int, task_feature_lengths: Mapping[str, int],
    seed: int = 0, template: str = DEMONSTRATION, batch_size: int = 8,
) -> tuple[float, np.ndarray]:
    """Accuracy (0-1) of rank classification over `labels` after k demonstrations, and the [n, classes] scores.

    The prompt has no EOS: the label continues it. A prompt longer than task_feature_lengths['inputs'] keeps
    its end (the query and the nearest demonstrations), as left truncation of a decoder's context does.
    """
    demonstrations = [(text, labels[label]) for text, label in draw_demonstrations(train, k, seed)]
    limit = task_feature_lengths["inputs"]
    inputs = [vocabulary.encode(few_shot_prompt(demonstrations, text, template))[-limit:] for text, _ in queries]
    candidates = rank_classification.encode_candidates(vocabulary, [f" {label}" for label in labels],
                                                       task_feature_lengths["targets"])
    scores = rank_classification.candidate_log_likelihoods(
        model, params, inputs, candidates, task_feature_lengths, batch_size, causal_prompt=True,
    )
    gold = np.asarray([label for _, label in queries])
    return float(np.mean(scores.argmax(axis=1) == gold)), scores
