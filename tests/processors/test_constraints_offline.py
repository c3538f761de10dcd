"""Offline constraint extraction: typed entries, overrides, retractions, merging."""

from __future__ import annotations

from datetime import UTC, datetime

from contextmode.processors.base import ConstraintExtractor, ConstraintUpdate
from contextmode.processors.constraints import OfflineConstraintExtractor, apply_update
from contextmode.types import Constraint, Turn


def _turn(seq: int, content: str, role: str = "user") -> Turn:
    return Turn(seq=seq, role=role, content=content, tokens=len(content),  # type: ignore[arg-type]
                created_at=datetime.now(UTC))


def _run(texts: list[str], extractor: OfflineConstraintExtractor | None = None) -> list[Constraint]:
    ex = extractor or OfflineConstraintExtractor()
    pinned: list[Constraint] = []
    for seq, text in enumerate(texts, 1):
        pinned = apply_update(pinned, ex.extract_text(text, pinned, source_seq=seq))
    return pinned


def _by_key(pinned: list[Constraint]) -> dict[str, Constraint]:
    return {c.key: c for c in pinned}


def test_chinese_constraints_preferences_and_identity() -> None:
    pinned = _by_key(_run(["我叫李雷，我是学生，住在北京。", "我不吃辣，预算五十以内，对花生过敏。",
                           "我喜欢周杰伦。", "我有两个孩子"]))
    assert pinned["name"].value.endswith("李雷") and pinned["name"].kind == "identity"
    assert "学生" in pinned["job"].value
    assert "北京" in pinned["location"].value
    assert pinned["spice"].value == "不吃辣" and pinned["spice"].kind == "constraint"
    assert "五十" in pinned["budget"].value and "以内" in pinned["budget"].value
    assert pinned["allergy:花生"].source_seq == 2
    assert pinned["allergy:花生"].quote == "对花生过敏。"  # the clause it came from, whole
    assert pinned["like:周杰伦"].kind == "preference"
    assert "两个孩子" in pinned["family:孩子"].value


def test_newer_value_overrides_in_place() -> None:
    pinned = _run(["预算五十以内", "我叫小明", "价格控制在100元以内"])
    assert [c.key for c in pinned] == ["budget", "name"]
    assert pinned[0].value == "预算100元以内"
    assert pinned[0].source_seq == 3


def test_explicit_retraction_removes_the_key() -> None:
    ex = OfflineConstraintExtractor()
    current = _run(["我不吃辣", "对花生过敏"])
    update = ex.extract_text("我现在能吃辣了", current, source_seq=3)
    assert update.remove_keys == ("spice",)
    assert not update.upsert
    after = apply_update(current, update)
    assert [c.key for c in after] == ["allergy:花生"]
    assert not _by_key(_run(["对花生过敏", "我不再对花生过敏了"]))


def test_english_identity_constraints_and_retraction() -> None:
    pinned = _by_key(_run([
        "My name is Anna and I live in Boston. I'm a vegetarian.",
        "I have two kids and a dog. I'm allergic to peanuts!",
        "I'm 34 years old and I work as a nurse at the city hospital.",
        "My budget is $50.",
    ]))
    assert pinned["name"].value == "name: Anna"
    assert "Boston" in pinned["location"].value
    assert pinned["diet"].value == "vegetarian"
    assert "two kids" in pinned["family:kid"].value
    assert "peanuts" in pinned["allergy:peanuts"].value
    assert pinned["age"].value == "age 34"
    assert "nurse" in pinned["job"].value
    assert "$50" in pinned["budget"].value
    after = _by_key(_run(["I'm a vegetarian.", "I love hiking.", "I eat meat again now.",
                          "I don't like hiking anymore."]))
    assert "diet" not in after
    assert "like:hiking" not in after


def test_stated_after_a_retraction_in_the_same_turn_wins() -> None:
    ex = OfflineConstraintExtractor()
    current = _run(["I live in Boston."])
    update = ex.extract_text("I don't live in Boston anymore. I moved to Denver.", current)
    assert "location" not in update.remove_keys
    assert _by_key(apply_update(current, update))["location"].value == "lives in Denver"


def test_questions_and_small_talk_pin_nothing() -> None:
    ex = OfflineConstraintExtractor()
    for text in ["你喜欢吃辣吗？", "Do you like hiking?", "你好", "Thanks, that sounds great!"]:
        assert ex.extract_text(text) == ConstraintUpdate()


def test_generic_facts_can_be_turned_off() -> None:
    text = "I play guitar in a band."
    assert OfflineConstraintExtractor().extract_text(text).upsert[0].kind == "fact"
    assert not OfflineConstraintExtractor(generic_facts=False).extract_text(text).upsert


async def test_extractor_reads_user_turns_only() -> None:
    ex = OfflineConstraintExtractor()
    assert isinstance(ex, ConstraintExtractor)
    update = await ex.extract(_turn(7, "我对海鲜过敏"), [])
    assert update.upsert[0].source_seq == 7
    assert await ex.extract(_turn(8, "我对海鲜过敏", role="assistant"), []) == ConstraintUpdate()


def test_apply_update_is_pure() -> None:
    current = [Constraint(key="a", value="1"), Constraint(key="b", value="2")]
    update = ConstraintUpdate(upsert=[Constraint(key="c", value="3"), Constraint(key="a", value="9")],
                              remove_keys=["b"])
    merged = apply_update(current, update)
    assert [(c.key, c.value) for c in merged] == [("a", "9"), ("c", "3")]
    assert [c.value for c in current] == ["1", "2"]


def test_seed_003_examples() -> None:
    pinned = _by_key(_run(["不要辣椒", "价格控制在五十以内", "我家在南方", "我喜欢周杰伦",
                           "别给我推荐日料", "我减肥，晚上不吃主食"]))
    assert pinned["spice"].value == "不吃辣"
    assert pinned["budget"].value == "预算五十元以内"
    assert pinned["location"].value == "住在南方"
    assert pinned["like:周杰伦"].value == "喜欢周杰伦"
    assert pinned["avoid:日料"].kind == "constraint"
    assert pinned["diet:主食"].value == "不吃主食"


def test_per_person_budget_is_pinned_with_the_other_constraints() -> None:
    from contextmode.processors.constraints import OfflineConstraintExtractor

    update = OfflineConstraintExtractor().extract_text("四个人，我不吃辣，预算人均五十以内。", [], source_seq=3)
    values = {c.key: c.value for c in update.upsert}
    assert values["spice"] == "不吃辣"
    assert values["budget"] == "预算人均五十元以内"
