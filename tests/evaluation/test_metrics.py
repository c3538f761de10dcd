"""Shared evaluation metrics on hand-computed examples."""

from __future__ import annotations

import math

import pytest

from contextmode.evaluation.metrics import (
    balanced_accuracy,
    binary_scores,
    bleu,
    bleu_tokens,
    exact_match,
    ngrams,
    pearson,
    ranks,
    restoration_scores,
    roc_auc,
    spearman,
    tokenize,
)


def test_binary_scores_hand_example() -> None:
    gold = [1, 1, 1, 0, 0]
    predicted = [1, 1, 0, 1, 0]
    scores = binary_scores(gold, predicted)
    # tp=2 fp=1 fn=1 tn=1
    assert (scores["tp"], scores["fp"], scores["fn"], scores["tn"]) == (2, 1, 1, 1)
    assert scores["accuracy"] == 0.6
    assert scores["precision"] == pytest.approx(2 / 3, abs=1e-4)
    assert scores["recall"] == pytest.approx(2 / 3, abs=1e-4)
    assert scores["f1"] == pytest.approx(2 / 3, abs=1e-4)
    # negative class: precision 1/2, recall 1/2 → F1 1/2; macro = (2/3 + 1/2) / 2
    assert scores["macro_f1"] == pytest.approx((2 / 3 + 0.5) / 2, abs=1e-4)


def test_binary_scores_always_yes_has_zero_negative_f1() -> None:
    scores = binary_scores([1, 1, 0, 0], [1, 1, 1, 1])
    assert scores["recall"] == 1.0
    assert scores["f1"] == pytest.approx(2 / 3, abs=1e-4)
    assert scores["macro_f1"] == pytest.approx(1 / 3, abs=1e-4)


def test_binary_scores_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError):
        binary_scores([1], [1, 0])


def test_exact_match_normalises_space_and_case() -> None:
    assert exact_match(["Who is  he?", "b"], ["who is he?", "c"]) == 0.5
    assert exact_match([], []) == 0.0


def test_tokenize_languages() -> None:
    assert tokenize("When was he born?") == ["when", "was", "he", "born", "?"]
    assert "王菲" in tokenize("王菲老公是谁")
    assert ngrams(["a", "b", "c"], 2) == [("a", "b"), ("b", "c")]
    assert bleu_tokens("王菲 is") == ["王", "菲", "is"]


def test_restoration_scores_hand_example() -> None:
    originals = ["a b", "c"]
    references = ["a x b", "y c"]
    predictions = ["a x b", "z c"]
    scores = restoration_scores(originals, predictions, references)
    # unigrams: restored x (hit), z (miss) vs x, y → p = r = 1/2
    assert scores["restoration_p1"] == 0.5
    assert scores["restoration_r1"] == 0.5
    assert scores["restoration_f1"] == 0.5
    # bigrams: (a x), (x b) hit, (z c) miss vs (a x), (x b), (y c) → 2/3 each
    assert scores["restoration_f2"] == pytest.approx(2 / 3, abs=1e-4)
    # trigrams: (a x b) only, on both sides
    assert scores["restoration_f3"] == 1.0


def test_restoration_of_do_nothing_is_zero() -> None:
    scores = restoration_scores(["he left"], ["he left"], ["Zappa left"])
    assert scores["restoration_p1"] == scores["restoration_r1"] == scores["restoration_f1"] == 0


def test_bleu_identical_is_100() -> None:
    assert bleu(["the cat sat on the mat"], ["the cat sat on the mat"])["bleu"] == 100.0


def test_bleu_hand_example_with_smoothing() -> None:
    result = bleu(["a b c d"], ["a b c e"])
    # p1 3/4, p2 2/3, p3 1/2, p4 0/1 → smoothed 1/(2·1); equal lengths → BP 1
    expected = 100 * math.exp((math.log(0.75) + math.log(2 / 3) + math.log(0.5)
                               + math.log(0.5)) / 4)
    assert result["bleu"] == pytest.approx(expected, abs=0.01)
    assert result["bp"] == 1.0


def test_bleu_brevity_penalty() -> None:
    result = bleu(["a b c d"], ["a b c d e f g h"])
    assert result["bp"] == pytest.approx(math.exp(1 - 8 / 4), abs=1e-4)
    assert result["bleu"] == pytest.approx(100 * math.exp(1 - 2), abs=0.01)


def test_bleu_empty_hypothesis() -> None:
    assert bleu([""], ["a b"])["bleu"] == 0.0


def test_ranks_average_ties() -> None:
    assert ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]


def test_pearson_and_spearman() -> None:
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(pearson([1.0], [2.0]))
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))
    # monotone but not linear: rank correlation is still perfect
    assert spearman([1, 2, 3, 4], [1, 4, 9, 100]) == pytest.approx(1.0)


def test_roc_auc_mann_whitney() -> None:
    assert roc_auc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == pytest.approx(1.0)
    assert roc_auc([0.1, 0.2, 0.9, 0.8], [True, True, False, False]) == pytest.approx(0.0)
    # one tie between a positive and a negative counts half: (1 + 0.5) / 2
    assert roc_auc([0.9, 0.5, 0.5], [True, True, False]) == pytest.approx(0.75)
    assert math.isnan(roc_auc([0.1, 0.2], [True, True]))


def test_balanced_accuracy() -> None:
    # positives: 1 of 2 above the cut; negatives: 2 of 2 below
    assert balanced_accuracy([0.9, 0.1, 0.2, 0.0], [True, True, False, False], 0.5) == pytest.approx(0.75)
    assert math.isnan(balanced_accuracy([0.9], [True], 0.5))
