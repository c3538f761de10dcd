"""Summary audit: lost numbers, entities and constraints are found and put back."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from contextmode.processors.audit import (
    AuditedSummarizer,
    audit_summary,
    extract_facts,
    fact_kept,
    restore_facts,
    split_facts_line,
)
from contextmode.processors.base import Summarizer, SummaryResult
from contextmode.types import Summary, Turn


def _turn(seq: int, content: str, role: str = "user") -> Turn:
    return Turn(seq=seq, role=role, content=content, tokens=len(content),  # type: ignore[arg-type]
                created_at=datetime.now(UTC))


ZH_TURNS = [
    _turn(1, "我下周三去北京出差，预算3000元以内。"),
    _turn(2, "好的，我帮你看看北京的酒店。", role="assistant"),
    _turn(3, "帮我订下午3点的高铁，我对花生过敏。"),
]


def test_extract_facts_finds_numbers_with_units_and_entities() -> None:
    zh = [f.text for f in extract_facts("我下周三去北京出差，预算3000元以内，五十块也行")]
    assert "3000元" in zh
    assert "五十块" in zh
    assert "北京" in zh
    en = [f.text for f in extract_facts("We met Sarah Connor in Paris in 2023; tickets were $20 at 3:30 pm.")]
    assert {"Sarah Connor", "Paris", "2023", "$20"} <= set(en)
    assert "We" not in en


def test_number_spellings_count_as_kept() -> None:
    fact = next(f for f in extract_facts("预算五十元") if f.kind == "number")
    assert fact_kept(fact, "用户预算50元")
    assert not fact_kept(fact, "用户预算不多")


def test_audit_lists_what_the_summary_dropped() -> None:
    lost = audit_summary("用户要去北京出差。", ZH_TURNS)
    assert "3000元" in lost
    assert "3点" in lost
    assert "北京" not in lost
    assert any("花生" in item for item in lost)  # the allergy constraint


def test_restore_appends_a_compact_facts_line() -> None:
    result = restore_facts("用户要去北京出差。", ZH_TURNS)
    body, items = split_facts_line(result.text)
    assert body == "用户要去北京出差。"
    assert result.text.splitlines()[-1].startswith("要点: ")
    assert audit_summary(result.text, ZH_TURNS) == []
    assert list(result.restored_facts) == items
    assert any("3000元" in item for item in items)


def test_restore_keeps_the_facts_line_bounded_and_merged() -> None:
    first = restore_facts("Alice went out.", [_turn(1, "I paid $20 for lunch with Bob at 2pm.")])
    assert first.text.splitlines()[-1].startswith("Facts: ")
    second = restore_facts(first.text, [_turn(2, "Then I spent $45 on a taxi.")], max_items=2)
    _, items = split_facts_line(second.text)
    assert len(items) == 2
    assert "$45" in items[-1]
    assert second.text.count("Facts: ") == 1


class _DroppingSummarizer:
    """A fake inner summariser that forgets every number."""

    async def summarize(self, previous: Summary | None, turns: Sequence[Turn]) -> SummaryResult:
        return SummaryResult(text="用户下周要去北京出差，想订高铁。")


async def test_audited_summarizer_restores_a_dropped_number() -> None:
    inner = _DroppingSummarizer()
    audited = AuditedSummarizer(inner)
    assert isinstance(audited, Summarizer)
    result = await audited.summarize(None, ZH_TURNS)
    assert "3000元" in result.text
    assert "3点" in result.text
    assert result.restored_facts
    assert result.text.startswith("用户下周要去北京出差")


async def test_audited_summarizer_adds_nothing_when_nothing_was_lost() -> None:
    class Verbatim:
        async def summarize(self, previous: Summary | None, turns: Sequence[Turn]) -> SummaryResult:
            return SummaryResult(text="\n".join(t.content for t in turns))

    result = await AuditedSummarizer(Verbatim()).summarize(None, ZH_TURNS)
    assert result.restored_facts == ()
    assert "要点" not in result.text
