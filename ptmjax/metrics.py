"""seqio metric functions: `fn(targets, predictions)` (or `fn(targets, scores)`) -> {name: float}.

seqio sorts a task's metric functions by their positional argument names, so
those names are fixed. Targets and predictions are what the task's
postprocessor returns: class ids for classification, floats for STS-B, text
for generation. The functions wrap scikit-learn, SciPy, sacrebleu and
rouge_score rather than reimplementing them, and import them when first called:
a training run imports this module (its tasks name these functions) but calls
none of them, and scikit-learn with SciPy alone take about 0.8 s to import.

Scale: like T5 (`t5.evaluation.metrics`), every value except perplexity is
reported on 0-100: accuracy, F1, exact match, BLEU, ROUGE, and also the
Matthews, Pearson and Spearman correlations (100 x the coefficient, in -100..100).
"""

from __future__ import annotations

import collections
import math
import re
import string
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import seqio

ROUGE_KEYS = ("rouge1", "rouge2", "rougeLsum")


def accuracy(targets: Sequence[Any], predictions: Sequence[Any]) -> dict[str, float]:
    """{'accuracy': % of predictions equal to their target} (labels of any comparable type)."""
    from sklearn.metrics import accuracy_score

    return {"accuracy": 100.0 * accuracy_score(targets, predictions)}


def f1_binary(targets: Sequence[int], predictions: Sequence[int]) -> dict[str, float]:
    """{'f1': F1 of class 1} over 0/1 labels; a prediction that is neither (-1: unparseable) is wrong, as in T5."""
    from sklearn.metrics import f1_score

    targets, predictions = np.asarray(targets), np.array(predictions)
    invalid = (predictions != 0) & (predictions != 1)
    predictions[invalid] = 1 - targets[invalid]
    return {"f1": 100.0 * f1_score(targets, predictions)}


def f1_macro(targets: Sequence[Any], predictions: Sequence[Any]) -> dict[str, float]:
    """{'f1_macro': unweighted mean of the per-class F1 over every label in the targets or predictions}."""
    from sklearn.metrics import f1_score

    return {"f1_macro": 100.0 * f1_score(targets, predictions, average="macro")}


def multiclass_f1(num_classes: int) -> Callable[[Sequence[int], Sequence[int]], dict[str, float]]:
    """T5's `mean_multiclass_f1`: mean F1 over the classes 0..num_classes-1, key 'mean_{num_classes}class_f1'.

    A prediction outside those classes (-1: unparseable) is wrong: it lowers its target class' recall.
    """
    if num_classes < 2:
        raise ValueError(f"multiclass_f1 needs num_classes >= 2, got {num_classes}")
    key = f"mean_{num_classes}class_f1"

    def metric(targets: Sequence[int], predictions: Sequence[int]) -> dict[str, float]:
        from sklearn.metrics import f1_score

        score = f1_score(targets, predictions, labels=range(num_classes), average="macro")
        return {key: 100.0 * score}

    return metric


def matthews_corrcoef(targets: Sequence[Any], predictions: Sequence[Any]) -> dict[str, float]:
    """{'matthews_corrcoef': 100 x Matthews' correlation} (CoLA's metric)."""
    from sklearn.metrics import matthews_corrcoef as coefficient

    return {"matthews_corrcoef": 100.0 * coefficient(targets, predictions)}


def pearson_corrcoef(targets: Sequence[float], predictions: Sequence[float]) -> dict[str, float]:
    """{'pearson_corrcoef': 100 x Pearson's r} of float targets and predictions."""
    from scipy.stats import pearsonr

    return {"pearson_corrcoef": 100.0 * float(pearsonr(targets, predictions)[0])}


def spearman_corrcoef(targets: Sequence[float], predictions: Sequence[float]) -> dict[str, float]:
    """{'spearman_corrcoef': 100 x Spearman's rho} of float targets and predictions."""
    from scipy.stats import spearmanr

    return {"spearman_corrcoef": 100.0 * float(spearmanr(targets, predictions)[0])}


_PUNCTUATION = frozenset(string.punctuation)


def normalize_squad(text: str) -> str:
    """The official SQuAD v1.1 normalisation: lower-case, drop punctuation, articles and extra whitespace."""
    text = "".join(char for char in text.lower() if char not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _squad_f1(target: str, prediction: str) -> float:
    target_tokens, prediction_tokens = normalize_squad(target).split(), normalize_squad(prediction).split()
    common = collections.Counter(target_tokens) & collections.Counter(prediction_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(prediction_tokens), overlap / len(target_tokens)
    return 2 * precision * recall / (precision + recall)


def squad(targets: Sequence[Sequence[str]], predictions: Sequence[str]) -> dict[str, float]:
    """{'em', 'f1'}: SQuAD v1.1 exact match and token F1 in %, each example scored against its best gold answer.

    Each target is the list of an example's gold answers (a single string is one answer).
    """
    em, f1 = [], []
    for answers, prediction in zip(targets, predictions, strict=True):
        answers = [answers] if isinstance(answers, str) else list(answers)
        if not answers:
            raise ValueError(f"an example has no gold answer to score the prediction {prediction!r} against")
        em.append(max(float(normalize_squad(answer) == normalize_squad(prediction)) for answer in answers))
        f1.append(max(_squad_f1(answer, prediction) for answer in answers))
    return {"em": 100.0 * float(np.mean(em)), "f1": 100.0 * float(np.mean(f1))}


def bleu(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """{'bleu': sacrebleu's corpus BLEU} with one reference per example and T5's settings ('intl' tokenizer,
    exponential smoothing, no lower-casing)."""
    import sacrebleu

    score = sacrebleu.corpus_bleu(
        list(predictions), [list(targets)], smooth_method="exp", lowercase=False, tokenize="intl",
        use_effective_order=False,
    )
    return {"bleu": score.score}


def chrf(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """{'chrf': sacrebleu's corpus chrF} with one reference per example and sacrebleu's defaults (chrF2:
    character 1- to 6-grams without spaces, no word n-grams, recall weighted by beta = 2)."""
    import sacrebleu

    return {"chrf": sacrebleu.corpus_chrf(list(predictions), [list(targets)]).score}


def _sentences_on_lines(summary: str) -> str:
    """T5's preparation for rougeLsum, which splits sentences on newlines: a ' . ' ends a line."""
    return summary.replace(" . ", " .\n")


def rouge(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """{'rouge1', 'rouge2', 'rougeLsum'}: mean F-measure in % (rouge_score, Porter stemming).

    rougeLsum treats each line as a sentence; as T5 does, ' . ' first ends a line. T5 reports the
    bootstrap aggregator's mid value, an estimate of this mean; the plain mean here is deterministic.
    """
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)
    totals = dict.fromkeys(ROUGE_KEYS, 0.0)
    for target, prediction in zip(targets, predictions, strict=True):
        scores = scorer.score(target=_sentences_on_lines(target), prediction=_sentences_on_lines(prediction))
        for key in ROUGE_KEYS:
            totals[key] += scores[key].fmeasure
    count = max(len(targets), 1)
    return {key: 100.0 * total / count for key, total in totals.items()}


def perplexity(vocabulary: seqio.Vocabulary) -> Callable[[Sequence[str], Sequence[float]], dict[str, float]]:
    """A score metric of per-example log-likelihoods: {'perplexity': exp(-sum log p / number of target tokens)}.

    seqio hands a score metric the (postprocessed) target texts and the model's summed log-likelihood of each
    target; the token count comes from encoding each text with the task's `vocabulary`, plus 1 for EOS (which
    the model scores too). So the task's postprocessor must leave the target text as it is, and targets must
    not have been truncated to the targets length (their log-likelihood would cover fewer tokens).
    """

    def metric(targets: Sequence[str], scores: Sequence[float]) -> dict[str, float]:
        if len(targets) != len(scores):
            raise ValueError(f"perplexity got {len(targets)} targets but {len(scores)} scores")
        num_tokens = sum(len(vocabulary.encode(target)) + 1 for target in targets)
        return {"perplexity": math.exp(-float(np.sum(scores)) / num_tokens)}

    return metric


def retrieval_at_1(targets: Sequence[str], predictions: Sequence[Any]) -> dict[str, float]:
    """{'retrieval_at_1': % of anchors whose most cosine-similar positive among all the split's is right}.

    predictions: each example's (anchor, positive) embeddings, [2, d]; targets: each example's positive text.
    The retrieved positive is right when its text is the anchor's own (a body that two examples share is
    either's); ties go to the first in the split's order.
    """
    from ptmjax.families.losses import cosine_similarities

    pairs = np.asarray(predictions, np.float32)
    nearest = np.argmax(np.asarray(cosine_similarities(pairs[:, 0], pairs[:, 1])), axis=1)
    right = [targets[int(j)] == target for j, target in zip(nearest, targets, strict=True)]
    return {"retrieval_at_1": 100.0 * float(np.mean(right))}


def _first_per_group(targets: Sequence[Mapping[str, Any]], predictions: Sequence[Any]) -> tuple[list, list]:
    """The (target, prediction) of the first example of each target 'group'."""
    seen: set[Hashable] = set()
    kept_targets, kept_predictions = [], []
    for target, prediction in zip(targets, predictions, strict=True):
        if target["group"] not in seen:
            seen.add(target["group"])
            kept_targets.append(target)
            kept_predictions.append(prediction)
    return kept_targets, kept_predictions


def multirc(targets: Sequence[Mapping[str, Any]], predictions: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """MultiRC: {'f1': `f1_binary` over every answer, 'exact_match': % of questions whose answers are all right}.

    Targets are {'value': 0/1, 'group': question id}, predictions {'value': 0/1 or -1}, as T5's
    `multirc_f1_over_all_answers` and `mean_group_metric(all_match)`.
    """
    values = [target["value"] for target in targets]
    predicted = [prediction["value"] for prediction in predictions]
    by_group: dict[Hashable, bool] = {}
    for target, value, prediction in zip(targets, values, predicted, strict=True):
        by_group[target["group"]] = by_group.get(target["group"], True) and value == prediction
    return {**f1_binary(values, predicted), "exact_match": 100.0 * float(np.mean(list(by_group.values())))}


def record(targets: Sequence[Mapping[str, Any]], predictions: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """ReCoRD: `squad` ('em', 'f1') once per query: targets {'value': gold answers, 'group': query id} repeat
    per gold answer (one example each, as T5 trains), so only the first example of each group counts, as
    T5's `deduplicate_metric(squad)`."""
    targets, predictions = _first_per_group(targets, predictions)
    return squad([target["value"] for target in targets], [prediction["value"] for prediction in predictions])


def bio_spans(tags: Sequence[str]) -> set[tuple[int, int, str]]:
    """(first, last, type) of each span of BIO tag names, as seqeval's default (IOB2, lenient) mode reads them:
    a span starts at B-X, or at an I-X after O or after a tag of another type, and runs over the I-X after it."""
    spans, start, kind = set(), None, None
    for index, tag in enumerate([*tags, "O"]):
        prefix, _, tag_kind = tag.partition("-")
        if start is not None and (prefix != "I" or tag_kind != kind):
            spans.add((start, index - 1, kind))
            start = None
        if prefix == "B" or (prefix == "I" and start is None):
            start, kind = index, tag_kind
    return spans


def token_tagging(tag_names: Sequence[str]) -> Callable[[Sequence[Sequence[int]], Sequence[Sequence[int]]], dict]:
    """Token accuracy and span F1 of BIO tagging: {'token_accuracy', 'span_precision', 'span_recall', 'span_f1'}.

    Each target is an example's tag ids, -1 where nothing is scored (a word's later sub-tokens, EOS,
    padding); its prediction holds a tag id at least at every scored position (others are ignored).
    Token accuracy is over the scored positions; spans (`bio_spans`) are read from the scored positions
    only and count when their boundaries and type match exactly, micro-averaged over all examples
    (seqeval's span F1; no predicted span gives precision 0).
    """
    names = list(tag_names)

    def metric(targets: Sequence[Sequence[int]], predictions: Sequence[Sequence[int]]) -> dict[str, float]:
        correct = scored = matched = num_gold = num_predicted = 0
        for target, prediction in zip(targets, predictions, strict=True):
            target = np.asarray(target)
            positions = np.flatnonzero(target >= 0)
            gold, predicted = target[positions], np.asarray(prediction)[positions]
            if ((predicted < 0) | (predicted >= len(names))).any():
                raise ValueError(f"predicted tag ids {sorted(set(predicted.tolist()))} must lie in 0..{len(names) - 1}"
                                 " at every scored position")
            correct, scored = correct + int((gold == predicted).sum()), scored + len(positions)
            gold_spans = bio_spans([names[i] for i in gold])
            predicted_spans = bio_spans([names[i] for i in predicted])
            matched += len(gold_spans & predicted_spans)
            num_gold, num_predicted = num_gold + len(gold_spans), num_predicted + len(predicted_spans)
        precision = matched / num_predicted if num_predicted else 0.0
        recall = matched / num_gold if num_gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if matched else 0.0
        return {"token_accuracy": 100.0 * correct / max(scored, 1), "span_precision": 100.0 * precision,
                "span_recall": 100.0 * recall, "span_f1": 100.0 * f1}

    return metric
