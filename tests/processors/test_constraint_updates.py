"""Constraint updates and retractions, Chinese and English, with the exact pins left after each.

A later statement replaces the pin with the same key; a retraction removes it; neither
leaves a raw ``fact:…`` copy of the words a typed rule read (that copy would keep the old
value in front of the model after an update)."""

from __future__ import annotations

import pytest

from contextmode.processors.constraints import OfflineConstraintExtractor, apply_update


def _pins(texts: list[str]) -> list[tuple[str, str]]:
    extractor = OfflineConstraintExtractor()
    pinned: list = []  # type: ignore[type-arg]
    for seq, text in enumerate(texts, 1):
        pinned = apply_update(pinned, extractor.extract_text(text, pinned, source_seq=seq))
    return [(c.key, c.value) for c in pinned]


UPDATES = [
    # -- English: updates ------------------------------------------------------------------
    (["My budget is $20 per meal.", "Raise the budget to $40."], [("budget", "budget $40")]),
    (["My budget is $20 per meal.", "Let's raise the budget to $40 per meal."], [("budget", "budget $40 per meal")]),
    (["My budget is $20.", "Change my budget to $35."], [("budget", "budget $35")]),
    (["My budget is $20.", "Increase my budget to 40 dollars."], [("budget", "budget 40 dollars")]),
    (["My budget is $20.", "Lower the budget to $15."], [("budget", "budget $15")]),
    (["My budget is $20.", "The budget is now $30."], [("budget", "budget $30")]),
    (["My budget is $20.", "Budget: $25."], [("budget", "budget $25")]),
    (["Budget under $50."], [("budget", "budget under $50")]),
    (["Budget under $50.", "I have a budget of around 300 dollars."], [("budget", "budget around 300 dollars")]),
    (["My plan: gym on Monday, budget under $50 per meal"],
     [("budget", "budget under $50 per meal"), ("fact:gym monday", "Gym on Monday.")]),
    (["I live in Boston.", "I moved to Seattle."], [("location", "lives in Seattle")]),
    (["My name is Anna.", "Actually, call me Annie."], [("name", "name: Annie")]),
    # -- English: retractions --------------------------------------------------------------
    (["My budget is $20.", "Forget the budget."], []),
    (["My budget is $20.", "No budget limit anymore."], []),
    (["Budget under $50.", "I no longer have a budget."], []),
    (["I'm allergic to peanuts.", "I'm not allergic to peanuts anymore."], []),
    (["I don't eat spicy food.", "I can eat spicy food now."], []),
    (["I'm vegetarian.", "I eat meat again now."], []),
    (["I don't eat pork.", "I eat pork now."], []),
    (["I'm a vegan.", "I'm not vegan anymore."], []),
    # -- Chinese: updates ------------------------------------------------------------------
    (["预算每餐20元", "预算提高到40元"], [("budget", "预算40元")]),
    (["预算20元", "预算改成35元"], [("budget", "预算35元")]),
    (["预算五十以内", "价格控制在100元以内"], [("budget", "预算100元以内")]),
    (["我住在北京", "我搬到了上海"], [("location", "住在上海")]),
    (["我叫小明", "我叫小红"], [("name", "名字: 小红")]),
    # -- Chinese: retractions --------------------------------------------------------------
    (["预算20元", "不用考虑预算了"], []),
    (["预算20元", "预算不限"], []),
    (["预算20元", "没有预算限制了"], []),
    (["我不吃辣", "我现在能吃辣了"], []),
    (["对花生过敏", "我不再对花生过敏了"], []),
    (["我吃素", "我现在吃肉了"], []),
    # -- both: what was not touched stays --------------------------------------------------
    (["I don't eat spicy food. My budget is $20.", "Raise the budget to $40."],
     [("spice", "no spicy food"), ("budget", "budget $40")]),
    (["我不吃辣，预算20元", "不用考虑预算了"], [("spice", "不吃辣")]),
]


@pytest.mark.parametrize(("texts", "expected"), UPDATES, ids=[" / ".join(t) for t, _ in UPDATES])
def test_update_or_retraction_leaves_exactly_these_pins(texts: list[str], expected: list[tuple[str, str]]) -> None:
    assert _pins(texts) == expected


@pytest.mark.parametrize("text", ["My budget is $20 per meal.", "I moved to Seattle.", "Call me Annie."])
def test_a_one_valued_fact_is_not_pinned_twice(text: str) -> None:
    assert not [key for key, _ in _pins([text]) if key.startswith("fact:")]
