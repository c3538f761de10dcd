"""The engine's turn end to end, on the in-memory store with fakes for every seam."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from contextmode.engine import Engine, Processors, TurnRequest
from contextmode.errors import ModelError, NoPreviousAnswer
from contextmode.processors.base import Rewrite
from contextmode.settings import EngineSettings
from contextmode.store import MemoryStore
from contextmode.testing import CharTokenCounter
from contextmode.testing.models import BrokenStream, FunctionModel, ScriptedModel
from contextmode.testing.processors import (
    ExclamationEmotion,
    JoiningSummarizer,
    KeywordDetector,
    PrefixRewriter,
    SpiceExtractor,
)
from contextmode.types import ChatMessage, NewTurn, SessionKey, SessionState, Turn


def make_engine(model: object, *, summarizer: JoiningSummarizer | None = None, **settings: object) -> Engine:
    return Engine(
        store=MemoryStore(),
        model=model,  # type: ignore[arg-type]
        counter=CharTokenCounter(),
        processors=Processors(
            detector=KeywordDetector(),
            rewriter=PrefixRewriter(),
            summarizer=summarizer or JoiningSummarizer(),
            extractor=SpiceExtractor(),
            emotion=ExclamationEmotion(),
        ),
        settings=EngineSettings(job_attempts=3, **settings),  # type: ignore[arg-type]
    )


def echo(messages: Sequence[ChatMessage]) -> list[str]:
    return ["收到：", messages[-1].content[:10]]


async def test_turn_stores_user_then_answer_and_runs_jobs() -> None:
    engine = make_engine(FunctionModel(echo))
    result = await engine.turn("t1", "s1", "我不吃辣！")
    assert result.answer.startswith("收到：")
    assert not result.partial
    await engine.drain()
    state = await engine.store.load(SessionKey("t1", "s1"))
    assert [t.role for t in state.turns] == ["user", "assistant"]
    assert state.turns[0].tokens == CharTokenCounter().count("我不吃辣！")
    assert state.turns[1].metadata["reply_to"] == 1
    assert state.last_answer == result.answer
    assert [c.value for c in state.constraints] == ["不吃辣"]
    assert state.turns[0].emotion == pytest.approx(0.9)


async def test_prepare_writes_nothing() -> None:
    engine = make_engine(FunctionModel(echo))
    prepared = await engine.prepare("t1", "s1", "你好")
    assert prepared.context.total_tokens > 0
    assert await engine.store.info(SessionKey("t1", "s1")) is None


async def test_broken_stream_keeps_user_turn_and_partial_answer() -> None:
    engine = make_engine(ScriptedModel([BrokenStream(chunks=["一半", "的回答"])]))
    with pytest.raises(ModelError):
        await engine.turn("t1", "s1", "讲个故事")
    state = await engine.store.load(SessionKey("t1", "s1"))
    assert [t.content for t in state.turns] == ["讲个故事", "一半的回答"]
    assert state.turns[1].partial
    assert state.last_answer == "一半的回答"


async def test_model_failure_before_any_token_keeps_only_user_turn() -> None:
    engine = make_engine(ScriptedModel([ModelError("503")]))
    with pytest.raises(ModelError):
        await engine.turn("t1", "s1", "在吗")
    state = await engine.store.load(SessionKey("t1", "s1"))
    assert [t.content for t in state.turns] == ["在吗"]


async def test_client_gone_mid_stream_stores_partial_answer() -> None:
    engine = make_engine(ScriptedModel([["第一段", "第二段", "第三段"]]))
    stream = engine.stream(TurnRequest(key=SessionKey("t1", "s1"), message="说三段话"))
    async for event in stream:
        if event.kind == "delta":
            break  # the client went away after the first delta
    await stream.aclose()
    state = await engine.store.load(SessionKey("t1", "s1"))
    assert [t.content for t in state.turns] == ["说三段话", "第一段"]
    assert state.turns[1].partial


async def test_follow_up_without_previous_answer_is_a_typed_error() -> None:
    engine = make_engine(FunctionModel(echo))
    # a user turn exists but no answer does
    await engine.store.append(SessionKey("t1", "s1"), [NewTurn(role="user", content="什么是熵", tokens=4)])
    with pytest.raises(NoPreviousAnswer, match="当前没有可用的上文信息"):
        await engine.prepare("t1", "s1", "举个例子")
    assert (await engine.store.version(SessionKey("t1", "s1"))).last_seq == 1


async def test_follow_up_intent_uses_seed000_template_over_last_answer() -> None:
    model = FunctionModel(echo)
    engine = make_engine(model)
    await engine.turn("t1", "s1", "什么是熵")
    await engine.turn("t1", "s1", "举个例子")
    sent = model.calls[-1].last_user
    assert sent.startswith("请基于以下内容举一个具体例子:")
    assert "收到：什么是熵" in sent
    state = await engine.store.load(SessionKey("t1", "s1"))
    assert state.turns[2].content == "举个例子"  # the user's words are stored, not the template
    assert state.turns[2].metadata["intent"] == "example"


async def test_decoupled_mode_sends_standalone_question_and_constraints_only() -> None:
    model = FunctionModel(echo)
    engine = make_engine(model, mode="decoupled")
    await engine.turn("t1", "s1", "我不吃辣")
    await engine.drain()
    await engine.turn("t1", "s1", "那个餐厅在哪")
    call = model.calls[-1]
    assert [m.role for m in call.messages] == ["system", "user"]
    assert call.last_user == "那个餐厅在哪（我不吃辣）"
    assert "不吃辣" in call.system


async def test_summary_job_covers_turns_outside_the_window_once() -> None:
    summarizer = JoiningSummarizer()
    engine = make_engine(FunctionModel(echo), summarizer=summarizer, summary_threshold=4, strategy="default")
    for i in range(8):
        await engine.turn("t1", "s1", f"第{i}个问题")
        await engine.drain()
    state = await engine.store.load(SessionKey("t1", "s1"))
    assert state.summary is not None
    # contiguous coverage from turn 1, never twice over the same range
    starts = [a for a, _ in summarizer.calls]
    ends = [b for _, b in summarizer.calls]
    assert starts[0] == 1
    assert all(s == e + 1 for s, e in zip(starts[1:], ends[:-1], strict=False))
    assert state.summary.covers_seq == ends[-1]
    assert state.summary.covers_seq <= state.last_seq - 8
    info = await engine.store.info(SessionKey("t1", "s1"))
    assert info is not None and info.jobs["summary"].ok == len(summarizer.calls)


async def test_failing_summariser_never_touches_turns_or_replies() -> None:
    summarizer = JoiningSummarizer(failures=3)
    engine = make_engine(FunctionModel(echo), summarizer=summarizer, summary_threshold=1, strategy="default")
    for i in range(5):
        result = await engine.turn("t1", "s1", f"消息{i}")
        assert result.answer  # replies never fail because of the summariser
    await engine.drain()
    turns = await engine.store.turns(SessionKey("t1", "s1"))
    assert [t.content for t in turns if t.role == "user"] == [f"消息{i}" for i in range(5)]
    info = await engine.store.info(SessionKey("t1", "s1"))
    assert info is not None and info.jobs["summary"].failed >= 1
    assert info.jobs["summary"].last_error is None or "summariser down" in info.jobs["summary"].last_error


async def test_turns_the_budget_drops_are_summarised_even_below_the_threshold() -> None:
    summarizer = JoiningSummarizer()
    # A window so small that 8 recent turns never fit, a threshold that is never reached.
    engine = make_engine(FunctionModel(echo), summarizer=summarizer, summary_threshold=100, context_window=260)
    dropped_seen: set[int] = set()
    for i in range(6):
        result = await engine.turn("t1", "s1", f"这是第{i}个比较长的问题，请仔细回答一下好吗")
        dropped_seen |= set(result.prepared.context.accounts["recent"].dropped_seqs)
        await engine.drain()
    assert dropped_seen, "the budget should have dropped turns"
    state = await engine.store.load(SessionKey("t1", "s1"))
    assert state.summary is not None
    # every turn the window dropped is now covered by the summary
    assert state.summary.covers_seq >= max(dropped_seen)
    assert summarizer.calls[0][0] == 1


async def test_offline_answers_are_marked_and_never_feed_the_rewriter() -> None:
    from contextmode.models.offline import OfflineResponder

    seen: list[list[str]] = []

    class RecordingRewriter(PrefixRewriter):
        async def rewrite(self, message: str, history: Sequence[Turn], *, summary: str | None = None) -> Rewrite:
            seen.append([t.role for t in history])
            return await super().rewrite(message, history, summary=summary)

    engine = make_engine(OfflineResponder(counter=CharTokenCounter()))
    engine.rewriter = RecordingRewriter()
    await engine.turn("t1", "s1", "推荐一家餐厅")
    await engine.turn("t1", "s1", "那个在哪")
    state = await engine.store.load(SessionKey("t1", "s1"))
    answers = [t for t in state.turns if t.role == "assistant"]
    assert answers and all(t.metadata["offline"] and t.metadata["model"] == "offline" for t in answers)
    assert seen == [["user"]]  # the offline description was left out of the rewrite's history


class _ContextEmotion:
    """A contextual emotion scorer that records the earlier turns it was given."""

    def __init__(self) -> None:
        self.priors: list[list[tuple[str, bool]]] = []

    async def score(self, text: str) -> float:
        return 0.5

    async def score_in_context(self, text: str, prior: Sequence[object]) -> float:
        self.priors.append([(p.text, p.same_speaker) for p in prior])  # type: ignore[attr-defined]
        return 0.5


class _CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.turn_reads = 0

    async def turns(self, key: SessionKey, *, from_seq: int = 1, to_seq: int | None = None) -> list[Turn]:
        self.turn_reads += 1
        return await super().turns(key, from_seq=from_seq, to_seq=to_seq)


async def test_emotion_job_reads_the_turns_before_as_loaded_and_reads_again_around_a_notice() -> None:
    from contextmode.engine.schedule import EMOTION_CONTEXT_TURNS

    store, scorer = _CountingStore(), _ContextEmotion()
    engine = Engine(store=store, model=FunctionModel(echo), counter=CharTokenCounter(),
                    processors=Processors(detector=KeywordDetector(), rewriter=PrefixRewriter(),
                                          summarizer=JoiningSummarizer(), extractor=SpiceExtractor(),
                                          emotion=scorer),  # type: ignore[arg-type]
                    settings=EngineSettings(strategy="window"))

    async def expected(seq: int) -> list[tuple[str, bool]]:
        earlier = await MemoryStore.turns(store, SessionKey("t", "s"), from_seq=max(1, seq - EMOTION_CONTEXT_TURNS), to_seq=seq - 1)
        return [(t.content, t.role == "user") for t in earlier]

    for i in range(3):
        await engine.turn("t", "s", f"第{i}个问题")
        await engine.drain()
    assert store.turn_reads == 0  # the loaded tail held every turn before
    assert scorer.priors == [await expected(1), await expected(3), await expected(5)]
    assert len(scorer.priors[2]) == 4
    # An engine notice in the window is not in the loaded state: the job reads the turns again.
    await store.append(SessionKey("t", "s"), [NewTurn(role="assistant", content="(离线)", tokens=1, metadata={"notice": True})])
    await engine.turn("t", "s", "还在吗")
    await engine.drain()
    assert store.turn_reads == 1
    assert scorer.priors[-1] == await expected(8)
    assert ("(离线)", False) in scorer.priors[-1]


class _LoadCountingStore(MemoryStore):
    """Counts the constraints-only loads (what the constraints job reads)."""

    def __init__(self) -> None:
        super().__init__()
        self.constraint_reads = 0

    async def load(self, key: SessionKey, **kwargs: object) -> SessionState:
        if kwargs.get("recent") == 0 and kwargs.get("max_uncovered") == 0:
            self.constraint_reads += 1
        return await super().load(key, **kwargs)  # type: ignore[arg-type]


def _offline_engine(store: MemoryStore, **settings: object) -> Engine:
    return Engine(store=store, model=FunctionModel(echo), counter=CharTokenCounter(),
                  processors=Processors.offline(),
                  settings=EngineSettings(summary_threshold=1000, **settings))  # type: ignore[arg-type]


async def test_the_offline_constraints_job_reads_the_stored_ones_only_for_a_turn_that_states_or_retracts() -> None:
    store = _LoadCountingStore()
    engine = _offline_engine(store, strategy="window")
    await engine.turn("t", "s", "那附近有什么好吃的？")  # states nothing: nothing read, nothing written
    await engine.drain()
    assert store.constraint_reads == 0
    await engine.turn("t", "s", "我不吃辣。")
    await engine.drain()
    assert store.constraint_reads == 1
    assert [c.value for c in (await store.load(SessionKey("t", "s"))).constraints] == ["不吃辣"]
    await engine.turn("t", "s", "我现在能吃辣了。")  # a retraction is matched against the stored ones
    await engine.drain()
    assert store.constraint_reads == 2
    assert (await store.load(SessionKey("t", "s"))).constraints == ()


async def test_a_model_backed_extractor_is_always_given_the_stored_constraints() -> None:
    store = _LoadCountingStore()
    engine = make_engine(FunctionModel(echo), strategy="window")
    engine.store = store
    engine.jobs = type(engine.jobs)(store)  # type: ignore[call-arg]
    await engine.turn("t", "s", "那附近有什么好吃的？")
    await engine.drain()
    assert store.constraint_reads == 1


async def test_the_recalled_turns_are_explained_once_per_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextmode.memory.recall as recall
    from contextmode.engine.trace import recalled_turns

    calls = 0
    explain = recall.explain_recall

    def counting(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        return explain(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(recall, "explain_recall", counting)
    from contextmode.api import build_engine

    engine = build_engine(store=MemoryStore(), model=FunctionModel(echo), counter=CharTokenCounter(),
                          settings=EngineSettings(strategy="default", summary_threshold=1000))
    for message in ("我下周去杭州出差，预算两千。", "好的", "杭州的预算是多少？"):
        result = await engine.turn("t", "s", message)
        await engine.drain()
    calls = 0
    result = await engine.turn("t", "s", "杭州出差的预算呢？")
    await engine.drain()
    shown = recalled_turns(result.prepared)  # the reply's context asks too: worked out once
    assert calls == 1
    trace = await engine.trace(SessionKey("t", "s"), 4)
    assert trace.recalled == shown
