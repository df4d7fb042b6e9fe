"""BIO spans and the token-tagging metric against hand-computed values."""

import pytest

from ptmjax import metrics

TAGS = ("O", "B-IDENT", "I-IDENT", "B-LIT", "I-LIT")


def test_bio_spans_read_as_seqeval_does():
    tags = ["B-IDENT", "I-IDENT", "O", "I-LIT", "I-LIT", "B-LIT", "I-IDENT", "B-LIT", "B-LIT"]
    # An I- after O or after another type starts a span; B- always does.
    assert metrics.bio_spans(tags) == {(0, 1, "IDENT"), (3, 4, "LIT"), (5, 5, "LIT"), (6, 6, "IDENT"),
                                       (7, 7, "LIT"), (8, 8, "LIT")}
    assert metrics.bio_spans(["O", "O"]) == set() and metrics.bio_spans([]) == set()


def test_token_accuracy_and_span_f1_hand_computed():
    # -1 marks unscored positions; predictions there (0 and 1) are ignored.
    targets = [[0, 1, -1, 2, 0, 3], [3, -1, 4, 0]]
    predictions = [[0, 1, 0, 2, 3, 3], [3, 1, 0, 0]]
    # Scored: gold O B-I I-I O B-L / predicted O B-I I-I B-L B-L: 4 of 5 right; spans gold {(1,2,I), (4,4,L)},
    # predicted {(1,2,I), (3,3,L), (4,4,L)}. Gold B-L I-L O / predicted B-L O O: 2 of 3; {(0,1,L)} vs {(0,0,L)}.
    # Tokens 6/8; spans: 2 matched of 4 predicted and 3 gold: P = 1/2, R = 2/3, F1 = 4/7.
    result = metrics.token_tagging(TAGS)(targets, predictions)
    assert result == pytest.approx({"token_accuracy": 75.0, "span_precision": 50.0, "span_recall": 200 / 3,
                                    "span_f1": 400 / 7})


def test_all_outside_predictions_score_no_span():
    result = metrics.token_tagging(TAGS)([[0, 1, 2, -1, 0]], [[0, 0, 0, 0, 0]])
    assert result == {"token_accuracy": 50.0, "span_precision": 0.0, "span_recall": 0.0, "span_f1": 0.0}


def test_a_predicted_tag_outside_the_tag_set_is_refused():
    with pytest.raises(ValueError, match=r"predicted tag ids \[0, 5\] must lie in 0..4"):
        metrics.token_tagging(TAGS)([[0, 1]], [[0, 5]])
    assert metrics.token_tagging(TAGS)([[0, -1]], [[0, 7]])["token_accuracy"] == 100.0  # unscored: not read
