"""seqio metric functions against hand-computed values and NumPy formulas."""

import math

import numpy as np
import pytest
import seqio
import tensorflow as tf

from ptmjax import metrics


def test_classification_metrics_hand_checked():
    assert metrics.accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == {"accuracy": 50.0}
    assert metrics.accuracy(["a", "b"], ["a", "b"]) == {"accuracy": 100.0}
    # -1 (unparseable) counts as wrong: [1, 0, 1, 1] against [1, 1, 0, 0]: P = 1/3, R = 1/2, F1 = 0.4.
    assert metrics.f1_binary([1, 1, 0, 0], [1, 0, 1, -1])["f1"] == pytest.approx(40.0)
    # Per-class F1 1, 0, 1/2 over the classes seen.
    assert metrics.f1_macro([0, 1, 2, 2], [0, 2, 2, 1])["f1_macro"] == pytest.approx(50.0)
    # Class 0: P = 1, R = 1/2 -> 2/3 (the -1 is a miss); classes 1 and 2: 1.
    assert metrics.multiclass_f1(3)([0, 0, 1, 2], [0, -1, 1, 2]) == {"mean_3class_f1": pytest.approx(800 / 9)}
    with pytest.raises(ValueError, match="num_classes >= 2, got 1"):
        metrics.multiclass_f1(1)


def test_matthews_and_correlations_match_numpy_formulas():
    targets, predictions = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]
    tp, tn, fp, fn = 2, 1, 1, 1
    want = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert metrics.matthews_corrcoef(targets, predictions)["matthews_corrcoef"] == pytest.approx(100 * want)
    x, y = np.array([0.2, 1.0, 3.8, 4.4, 2.6]), np.array([0.4, 1.6, 3.0, 5.0, 1.0])
    assert metrics.pearson_corrcoef(x, y)["pearson_corrcoef"] == pytest.approx(100 * np.corrcoef(x, y)[0, 1])
    ranks = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))  # no ties: Spearman is Pearson of ranks
    assert metrics.spearman_corrcoef(x, y)["spearman_corrcoef"] == pytest.approx(100 * np.corrcoef(*ranks)[0, 1])


def test_squad_normalises_and_takes_the_best_answer():
    assert metrics.normalize_squad("The  Cat's, a HAT!") == "cats hat"
    # 1: exact after normalisation; 2: 'quick fox jumps' vs 'quick brown fox': 2 common, P = R = 2/3.
    result = metrics.squad([["Paris", "the Eiffel Tower"], ["The quick brown fox"]],
                           ["Eiffel tower!", "a quick fox jumps"])
    assert result == {"em": pytest.approx(50.0), "f1": pytest.approx(100 * (1 + 2 / 3) / 2)}
    assert metrics.squad(["yes"], ["no"]) == {"em": 0.0, "f1": 0.0}
    with pytest.raises(ValueError, match="no gold answer"):
        metrics.squad([[]], ["x"])


def test_bleu_hand_computed():
    assert metrics.bleu(["Das Haus ist klein ."], ["Das Haus ist klein ."])["bleu"] == pytest.approx(100.0)
    # n-gram precisions 5/6, 3/5, 2/4, 1/3 and equal lengths (no brevity penalty): (1/12) ** (1/4).
    got = metrics.bleu(["the cat sat on a mat"], ["the cat sat on the mat"])["bleu"]
    assert got == pytest.approx(100 * (1 / 12) ** 0.25, abs=1e-9)


def test_rouge_hand_computed_with_stemming_and_sentence_lines():
    result = metrics.rouge(["the cat sat"], ["the cat ran"])
    assert result["rouge1"] == pytest.approx(200 / 3) and result["rouge2"] == pytest.approx(50.0)
    assert metrics.rouge(["cats running"], ["cat runs"])["rouge1"] == pytest.approx(100.0)  # Porter stems
    # Sentences swapped: rougeLsum matches each target sentence (' . ' ends a line); rouge2 loses 'sat dog'.
    swapped = metrics.rouge(["the cat sat . the dog ran"], ["the dog ran . the cat sat"])
    assert swapped["rougeLsum"] == pytest.approx(100.0) and swapped["rouge2"] < 100
    assert metrics.rouge(["a b", "c d"], ["a b", "x y"]) == {"rouge1": 50.0, "rouge2": 50.0, "rougeLsum": 50.0}


def test_perplexity_counts_target_tokens_with_eos_and_is_a_seqio_score_metric():
    vocabulary = seqio.ByteVocabulary()
    metric = metrics.perplexity(vocabulary)
    # 'ab' is 2 bytes + EOS, 'c' 1 + EOS: 5 tokens, log-likelihood -5 in all.
    assert metric(["ab", "c"], [-3.0, -2.0])["perplexity"] == pytest.approx(math.e)
    with pytest.raises(ValueError, match="2 targets but 1 scores"):
        metric(["ab", "c"], [-3.0])
    source = seqio.FunctionDataSource(lambda split, shuffle_files: tf.data.Dataset.range(1), splits=["train"])
    task = seqio.Task("test_perplexity_task", source, output_features={}, metric_fns=[metric, metrics.accuracy])
    assert task.score_metric_fns == [metric] and task.predict_metric_fns == [metrics.accuracy]


def test_multirc_groups_answers_by_question():
    targets = [{"value": 1, "group": (0, 0)}, {"value": 0, "group": (0, 0)}, {"value": 1, "group": (0, 1)}]
    result = metrics.multirc(targets, [{"value": 1}, {"value": 0}, {"value": 0}])
    # F1 over answers: [1, 0, 1] vs [1, 0, 0]: P = 1, R = 1/2; question (0, 1) is wrong.
    assert result == {"f1": pytest.approx(200 / 3), "exact_match": 50.0}


def test_record_scores_each_query_once():
    query = {"value": ["Obama", "Barack Obama"], "group": (0, 0)}
    targets = [query, query, {"value": ["Paris"], "group": (0, 1)}]  # the first query has one example per answer
    result = metrics.record(targets, [{"value": "Barack Obama"}, {"value": "ignored"}, {"value": "London"}])
    assert result == {"em": 50.0, "f1": 50.0}
