"""Do no harm: the user's words reach the model unless the engine is sure.

Regression tests for the examples of the issue that set the rule, with their exact strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from contextmode.api import build_engine
from contextmode.engine import Engine, Processors
from contextmode.models.offline import OfflineResponder
from contextmode.processors.base import Rewrite
from contextmode.processors.constraints import OfflineConstraintExtractor, apply_update
from contextmode.processors.rewrite import OfflineRewriter
from contextmode.processors.verify import check, verify_rewrite
from contextmode.settings import EngineSettings
from contextmode.store import MemoryStore
from contextmode.testing import CharTokenCounter
from contextmode.testing.models import FunctionModel
from contextmode.testing.processors import (
    ExclamationEmotion,
    JoiningSummarizer,
    KeywordDetector,
    SpiceExtractor,
)
from contextmode.types import ChatMessage, SessionKey, Turn

HANGZHOU = ["推荐几家杭州的餐厅", "杭州的知味观和外婆家都不错，西湖边的楼外楼也很有名。"]


def _turns(texts: Sequence[str]) -> list[Turn]:
    now = datetime.now(UTC)
    return [Turn(seq=i + 1, role="user" if i % 2 == 0 else "assistant", content=t, tokens=len(t),
                 created_at=now) for i, t in enumerate(texts)]


class FixedRewriter:
    """A rewriter that always proposes ``text``."""

    def __init__(self, text: str) -> None:
        self.text = text

    async def rewrite(self, message: str, history: Sequence[Turn], *, summary: str | None = None) -> Rewrite:
        return Rewrite(text=self.text, changed=self.text != message, source="test")


def _engine(rewriter: object, model: object, **settings: object) -> Engine:
    return Engine(
        store=MemoryStore(), model=model,  # type: ignore[arg-type]
        counter=CharTokenCounter(),
        processors=Processors(
            detector=KeywordDetector(), rewriter=rewriter,  # type: ignore[arg-type]
            summarizer=JoiningSummarizer(), extractor=SpiceExtractor(), emotion=ExclamationEmotion(),
        ),
        settings=EngineSettings(job_attempts=1, **settings),  # type: ignore[arg-type]
    )


def _echo(messages: Sequence[ChatMessage]) -> str:
    return "好的"


async def _after_hangzhou(proposal: str, **settings: object) -> tuple[Engine, FunctionModel]:
    """An engine whose rewriter proposes ``proposal``, after the Hangzhou restaurants exchange."""
    model = FunctionModel(_echo)
    engine = _engine(FixedRewriter(proposal), model, **settings)
    for role, text in zip(("user", "assistant"), HANGZHOU, strict=True):
        await engine.record("t", "s", role, text)  # type: ignore[arg-type]
    await engine.drain()
    return engine, model


# -- the offline rewriter -------------------------------------------------------------------


def test_it_after_hangzhou_restaurants_is_not_hangzhou() -> None:
    result = OfflineRewriter().rewrite_texts("它在哪？", HANGZHOU)
    assert result.text != "杭州在哪？"
    assert not result.changed  # several restaurants fit: the message is left alone


def test_latin_words_are_never_glued() -> None:
    context = ["我想喝点东西", "Green Tea is nice. Stub answer to your question."]
    result = OfflineRewriter().rewrite_texts("它在哪？", context)
    assert "GreenTea" not in result.text and "Stubanswerto" not in result.text
    assert not verify_rewrite("它在哪？", "GreenTea在哪？", context).ok
    assert not verify_rewrite("它在哪？", "Stubanswerto在哪？", context).ok


def test_one_clear_antecedent_is_still_resolved() -> None:
    assert OfflineRewriter().rewrite_texts("她老公是谁", ["你知道王菲吗", "王菲是歌坛天后，她的歌很好听。"]).text == "王菲老公是谁"
    # two people fit 他: left alone
    assert not OfflineRewriter().rewrite_texts("他多大了", ["王菲和谢霆锋", "谢霆锋和王菲都是歌手"]).changed


# -- the verifier ---------------------------------------------------------------------------


def test_verifier_rejects_invented_dropped_and_long_rewrites() -> None:
    sources = HANGZHOU
    assert verify_rewrite("它在哪？", "楼外楼在哪？", sources).ok
    invented = verify_rewrite("它在哪？", "上海外滩在哪？", sources)
    assert not invented.ok and "上海外滩" in invented.reason
    dropped = verify_rewrite("那家店几点开门", "楼外楼几点", sources)
    assert not dropped.ok and "开门" in dropped.reason
    assert not verify_rewrite("它在哪？", "楼外楼" * 30 + "在哪？", sources).ok
    assert verify_rewrite("When was he born?", "When was Frank Zappa born?", ["Frank Zappa was a musician."]).ok
    assert not verify_rewrite("When was he born?", "When was Elvis born?", ["Frank Zappa was a musician."]).ok


def test_verifier_never_takes_words_from_a_notice() -> None:
    notice = OfflineResponder().render([ChatMessage(role="user", content="推荐几家杭州的餐厅")])
    turns = [*_turns(["推荐几家杭州的餐厅"]),
             Turn(seq=2, role="assistant", content=notice, tokens=1, created_at=datetime.now(UTC),
                  metadata={"offline": True})]
    assert turns[1].notice
    proposal = Rewrite(text="模型在哪？", changed=True, source="test")
    from contextmode.processors.verify import rewrite_sources

    used, rejected = check("它在哪？", proposal, rewrite_sources(turns, None))
    assert not used.changed and used.text == "它在哪？"
    assert rejected is not None and "模型" in rejected.reason


# -- the engine: verbatim message, hint, decoupled, rejected rewrite in metadata ------------


async def test_contextual_mode_sends_the_message_verbatim_with_a_labelled_hint() -> None:
    engine, model = await _after_hangzhou("楼外楼在哪？")
    result = await engine.turn("t", "s", "那个在哪？")
    call = model.calls[-1]
    assert call.last_user == "那个在哪？"
    # The default order: the hint in the system message, the messages alternating.
    assert "楼外楼在哪？" in call.system and "提示" in call.system
    assert call.messages[-2].role == "assistant"
    assert result.user_turn.metadata["rewrite"] == "楼外楼在哪？"
    assert result.user_turn.metadata["rewrite_verified"] is True


async def test_rejected_rewrite_is_kept_in_metadata_and_not_sent() -> None:
    engine, model = await _after_hangzhou("上海外滩在哪？")
    result = await engine.turn("t", "s", "那个在哪？")
    call = model.calls[-1]
    assert call.last_user == "那个在哪？" and "上海外滩" not in call.system
    rejected = result.user_turn.metadata["rewrite_rejected"]
    assert rejected["text"] == "上海外滩在哪？" and "上海外滩" in rejected["reason"]
    assert "rewrite" not in result.user_turn.metadata


async def test_decoupled_mode_without_a_verified_rewrite_sends_message_and_last_exchange() -> None:
    engine, model = await _after_hangzhou("上海外滩在哪？", mode="decoupled")
    await engine.turn("t", "s", "那个在哪？")
    sent = [(m.role, m.content) for m in model.calls[-1].messages]
    assert sent[-3:] == [("user", HANGZHOU[0]), ("assistant", HANGZHOU[1]), ("user", "那个在哪？")]


async def test_decoupled_mode_sends_a_verified_rewrite_alone() -> None:
    engine, model = await _after_hangzhou("楼外楼在哪？", mode="decoupled")
    await engine.turn("t", "s", "那个在哪？")
    assert [m.role for m in model.calls[-1].messages] == ["system", "user"]
    assert model.calls[-1].last_user == "楼外楼在哪？"


@pytest.mark.parametrize("mode", ["decoupled", "contextual"])
async def test_a_rewrite_that_does_not_fit_gives_way_to_the_users_words(mode: str) -> None:
    # How much the turn takes with the verified rewrite (sent alone, or as a hint)…
    engine, _ = await _after_hangzhou("楼外楼在哪？", mode=mode, reply_reserve=0)
    roomy = await engine.turn("t", "s", "那个在哪？")
    rewritten = roomy.prepared.context
    assert "楼外楼在哪？" in rewritten.message + (rewritten.hint or "")
    # …then a window one token short of its whole layers (memory would give way first): the
    # user's own words are sent instead of an error.
    memory = sum(a.used for name, a in rewritten.accounts.items() if name not in ("system", "hint", "current"))
    engine, model = await _after_hangzhou("楼外楼在哪？", mode=mode, reply_reserve=0,
                                          context_window=rewritten.total_tokens - memory - 1)
    result = await engine.turn("t", "s", "那个在哪？")
    assert model.calls[-1].last_user == "那个在哪？" and "楼外楼" not in model.calls[-1].system
    assert result.prepared.context.hint is None and result.answer == "好的"


# -- engine notices never feed memory -------------------------------------------------------


async def test_offline_notices_are_not_summarised_and_context_does_not_balloon() -> None:
    engine = build_engine(store=MemoryStore(), settings=EngineSettings(summary_threshold=2))
    totals: list[int] = []
    for text in ["我想去杭州玩", "推荐几家杭州的餐厅", "它在哪？", "预算一百块", "有没有不辣的菜",
                 "那里人多吗", "谢谢"]:
        result = await engine.turn("t", "s", text)
        await engine.drain()
        totals.append(result.prepared.context.total_tokens)
        assert result.assistant_turn is not None and result.assistant_turn.notice
        assert result.prepared.context.message == text  # verbatim, always
    await engine.summarize_now("t", "s", force=True)
    state = await engine.store.load(SessionKey("t", "s"))
    summary = state.summary.text if state.summary else ""
    assert "未配置模型" not in summary and "tokens" not in summary and "ystem" not in summary
    assert not any(c.value.startswith("</") or "未配置" in c.value for c in state.constraints)
    # Notices are not history: the context grows with the user's words only.
    assert totals[-1] < totals[0] + 250, totals


# -- pins: whole, attributed, current -------------------------------------------------------


def _pins(texts: Sequence[str]) -> list[tuple[str, str, int]]:
    extractor, pinned = OfflineConstraintExtractor(), []
    for seq, text in enumerate(texts, 1):
        pinned = apply_update(pinned, extractor.extract_text(text, pinned, source_seq=seq))
    return [(c.key, c.value, c.source_seq) for c in pinned]


def test_no_fragment_or_markup_pins() -> None:
    pins = _pins(["我们去过一家云南菜馆，挺好吃的", "</script><script>alert(1)</script>", "I love hiking. </script>"])
    assert not any(key == "fact:们去过一家云南菜" or "们去过" in key for key, _, _ in pins)
    assert not any("<" in key or "<" in value or "script" in value for key, value, _ in pins)


def test_every_constraint_update_and_retraction() -> None:
    pins = _pins(["不吃辣、预算五十"])
    assert {key for key, _, _ in pins} == {"spice", "budget"}
    pins = _pins(["不吃辣、预算五十", "预算改成100吧"])
    budgets = [(value, seq) for key, value, seq in pins if key == "budget"]
    assert budgets == [("预算100元", 2)]  # one budget pin, the new value, from turn 2
    pins = _pins(["不吃辣、预算五十", "我现在能吃辣了"])
    assert [key for key, _, _ in pins] == ["budget"]


def test_pins_are_about_the_user() -> None:
    assert _pins(["我朋友不吃辣", "我男朋友预算两百"]) == []


async def test_llm_rewriter_passes_through_the_same_verifier() -> None:
    from contextmode.processors.llm import LLMRewriter
    from contextmode.testing.models import ScriptedModel

    # The model invents a place the conversation never named: the verifier refuses it.
    engine, model = await _after_hangzhou("unused")
    engine.rewriter = LLMRewriter(ScriptedModel(["西湖醋鱼馆在哪？"]))
    result = await engine.turn("t", "s", "那个在哪？")
    assert model.calls[-1].last_user == "那个在哪？"
    rejected = result.user_turn.metadata["rewrite_rejected"]
    assert rejected["source"] == "llm" and "西湖醋鱼馆" in rejected["reason"]
    # A grounded answer is accepted as a hint.
    engine.rewriter = LLMRewriter(ScriptedModel(["楼外楼在哪？"]))
    result = await engine.turn("t", "s", "那个在哪？")
    assert result.user_turn.metadata["rewrite_verified"] is True
    assert "楼外楼在哪？" in model.calls[-1].system
