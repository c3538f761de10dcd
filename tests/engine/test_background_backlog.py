"""Background work that never piles up, and replies bounded by what they say.

- Turns sent faster than the model scores them merge into the session's one unit of work: the
  model is asked about the newest turn, older ones are filled in by the offline processors
  (noted in the call log), and every turn is covered.
- A constraint job covering several turns asks once, and each pin names the turn it quotes.
- A reply that degenerates (a loop with variations, a script the conversation never used) is
  stopped: the turn ends with what was said, stored and traced as stopped.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from contextmode.api import build_engine
from contextmode.errors import OutputRejected
from contextmode.jobs import JobRunner
from contextmode.models.calls import call_log
from contextmode.processors.base import ConstraintUpdate
from contextmode.settings import EngineSettings
from contextmode.store import MemoryStore
from contextmode.testing import CharTokenCounter
from contextmode.testing.models import FunctionModel
from contextmode.types import ChatMessage, Constraint, SessionKey, Turn

from ..models.test_priority import until


class SlowScorer:
    """An emotion scorer standing for a model: each call waits for ``go``."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.scored: list[str] = []

    async def score(self, text: str) -> float:
        await self.go.wait()
        self.scored.append(text)
        return 0.9


class OneCallExtractor:
    """A constraint extractor standing for a model: pins every "budget N" it is shown."""

    def __init__(self) -> None:
        self.shown: list[str] = []

    async def extract(self, turn: Turn, current: Sequence[Constraint]) -> ConstraintUpdate:
        self.shown.append(turn.content)
        pins = []
        for line in turn.content.splitlines():
            if line.startswith("budget"):
                pins.append(Constraint(key="budget", value=line, source_seq=turn.seq, quote=line))
        return ConstraintUpdate(upsert=tuple(pins[-1:]))


def answer(messages: Sequence[ChatMessage]) -> str:
    return "ok"


def settings() -> EngineSettings:
    return EngineSettings(strategy="default", summary_threshold=1000)


async def test_turns_faster_than_the_model_merge_into_the_sessions_one_unit() -> None:
    engine = build_engine(store=MemoryStore(), model=FunctionModel(answer), counter=CharTokenCounter(),
                          settings=settings())
    scorer = SlowScorer()
    engine.emotion = scorer
    messages = ["first", "I am so angry!!!", "third", "fourth", "fifth"]
    await engine.turn("t", "s", messages[0])
    await until(lambda: engine.backlog.covering(SessionKey("t", "s")))  # the unit is scoring turn 1
    for message in messages[1:]:
        await engine.turn("t", "s", message)
        assert engine.jobs.pending("t", "s") == ["memory"]  # the running unit, nothing queued behind it
        assert isinstance(engine.jobs, JobRunner) and engine.jobs.units("t", "s") == 1
    # Constraints: the five turns (the unit's next step); emotion: the four since turn 1.
    assert engine.backlog.pending(SessionKey("t", "s")) == 5
    scorer.go.set()
    await engine.drain()
    # The model scored turn 1 and the newest; turns 2-4 were filled in offline, and said so.
    assert scorer.scored == ["first", "fifth"]
    state = await engine.store.load(SessionKey("t", "s"), recent=20)
    scored = {t.seq for t in state.turns if t.role == "user" and t.emotion is not None}
    assert scored == {t.seq for t in state.turns if t.role == "user"}
    notes = [c.outcome for c in call_log().between(0.0) if c.step == "emotion" and c.session == "s"]
    assert "filled in offline: 3 older turn(s), the model fell behind" in notes
    assert engine.backlog.pending(SessionKey("t", "s")) == 0
    await engine.close()


class RejectedScorer:
    """An emotion scorer standing for a model whose answers are unusable."""

    async def score(self, text: str) -> float:
        raise OutputRejected("no intensity in the answer")


async def test_a_rejected_score_is_counted_and_the_turn_is_scored_offline() -> None:
    engine = build_engine(store=MemoryStore(), model=FunctionModel(answer), counter=CharTokenCounter(),
                          settings=settings())
    engine.emotion = RejectedScorer()
    await engine.turn("t", "s", "I am so angry!!!")
    await engine.drain()
    info = await engine.store.info(SessionKey("t", "s"))
    assert info is not None and (info.jobs["emotion"].ok, info.jobs["emotion"].rejected) == (0, 1)
    assert info.jobs["emotion"].last_error == "no intensity in the answer"
    state = await engine.store.load(SessionKey("t", "s"), recent=20)
    [said] = [t for t in state.turns if t.role == "user"]
    assert said.emotion is not None and said.emotion > 0.5  # the offline scorer's, not the model's
    notes = [c.outcome for c in call_log().between(0.0) if c.step == "emotion" and c.session == "s"]
    assert "filled in offline: the model's score was rejected" in notes
    assert engine.backlog.pending(SessionKey("t", "s")) == 0  # dropped, not retried
    await engine.close()


async def test_one_constraint_call_covers_the_newest_turns_and_pins_name_their_turn() -> None:
    engine = build_engine(store=MemoryStore(), model=FunctionModel(answer), counter=CharTokenCounter(),
                          settings=settings())
    extractor = OneCallExtractor()
    engine.extractor = extractor
    gate = asyncio.Event()
    original = engine.jobs.schedule
    held: list[object] = []

    def schedule(*args: object, **kwargs: object) -> None:  # hold the jobs until every turn is in
        held.append((args, kwargs))

    engine.jobs.schedule = schedule  # type: ignore[method-assign]
    for message in ("hello", "budget 200", "and you?"):
        await engine.turn("t", "s", message)
    engine.jobs.schedule = original  # type: ignore[method-assign]
    for args, kwargs in held:
        original(*args, **kwargs)  # type: ignore[arg-type]
    gate.set()
    await engine.drain()
    assert extractor.shown == ["hello\nbudget 200\nand you?"]  # one call, the three turns
    state = await engine.store.load(SessionKey("t", "s"), recent=20)
    [pin] = state.constraints
    budget_turn = next(t for t in state.turns if t.content == "budget 200")
    assert pin.source_seq == budget_turn.seq
    await engine.close()


def streaming(*chunks: str) -> FunctionModel:
    async def reply(messages: Sequence[ChatMessage]) -> AsyncIterator[str]:
        for chunk in chunks:
            yield chunk

    return FunctionModel(reply)


RUSSIAN = (
    "Вокзал находится недалеко от центра города. Там есть несколько тихих ресторанов с хорошей кухней, "
    "где можно спокойно поговорить. Цены обычно умеренные, особенно в будние дни. Заранее позвоните и "
    "забронируйте столик у окна, чтобы вечером видеть огни площади. После ужина прогуляйтесь по набережной, "
    "воздух там свежий, а мосты красиво подсвечены до полуночи."
)
LOOP_WITH_VARIATIONS = "".join(f"我推荐你去第{i}家餐厅，那里很好吃。" for i in range(200))


@pytest.mark.parametrize(("said", "chunks", "why"), [
    ("推荐一家餐厅。", [LOOP_WITH_VARIATIONS[i : i + 8] for i in range(0, len(LOOP_WITH_VARIATIONS), 8)],
     "the reply keeps repeating the same phrases"),
    ("Where should we eat tonight?", ["Try the station area, there are a few quiet places near it. "] + [f"{w} " for w in RUSSIAN.split()],
     "the reply turned to a script the conversation does not use (cyrillic)"),
])
async def test_a_degenerating_reply_stops_early_and_the_turn_keeps_what_was_said(
    said: str, chunks: list[str], why: str
) -> None:
    model = streaming(*chunks)
    engine = build_engine(store=MemoryStore(), model=model, counter=CharTokenCounter(), settings=settings())
    result = await engine.turn("t", "s", said)
    await engine.drain()
    assert not result.partial and result.answer.strip()
    assert len(result.answer) < len("".join(chunks)) - 100  # stopped early, what was said kept
    assert "".join(chunks).startswith(result.answer)
    assert result.assistant_turn is not None and result.assistant_turn.metadata["stopped"] == why
    trace = await engine.trace(SessionKey("t", "s"), 1)
    assert trace.stopped == why
    await engine.close()


async def test_a_reply_in_the_users_own_script_is_never_cut() -> None:
    text = ("杭州西湖附近安静的餐厅不少。如果预算在两百以内，可以考虑湖滨一带的小馆子，菜量适中，价格公道。"
            "不吃辣的朋友可以点东坡肉、龙井虾仁和西湖醋鱼，这几道都是本地名菜，口味偏甜。"
            "周末人多，建议提前一两天打电话订位，最好要一个靠窗的位置，能看到湖景。"
            "饭后沿着白堤散步，大约半小时就能走到断桥，晚上灯光很好看。"
            "如果有人不喝酒，店里一般有鲜榨果汁和龙井茶，也可以自带饮料，不过要先问清楚开瓶费。")
    model = streaming(*[text[i : i + 5] for i in range(0, len(text), 5)])
    engine = build_engine(store=MemoryStore(), model=model, counter=CharTokenCounter(), settings=settings())
    result = await engine.turn("t", "s", "Any quiet restaurant in Hangzhou?")  # answered in Chinese
    assert result.answer == text
    assert result.assistant_turn is not None and "stopped" not in result.assistant_turn.metadata
    await engine.close()


class CountingSummarizer:
    """A summariser standing for a model (it says what its call costs of the window): counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def call_tokens(self, previous: object, turns: Sequence[Turn], counter: object) -> int:
        return 100

    async def summarize(self, previous: object, turns: Sequence[Turn]) -> object:
        from contextmode.processors.base import SummaryResult

        self.calls += 1
        return SummaryResult(text="the model's summary")


@pytest.mark.parametrize("behind", [False, True])
async def test_a_summary_due_while_the_model_is_behind_is_folded_offline_and_said_so(behind: bool) -> None:
    from contextmode.engine.schedule import _summary_step

    engine = build_engine(store=MemoryStore(), model=FunctionModel(answer), counter=CharTokenCounter(),
                          settings=settings())
    summarizer = CountingSummarizer()
    engine.summarizer = summarizer  # type: ignore[assignment]
    key = SessionKey("t", f"behind-{behind}")
    for i in range(6):
        await engine.record(key.tenant, key.session_id, "user", f"Question {i} about the Kyoto trip budget of {i}00 dollars")
        await engine.record(key.tenant, key.session_id, "assistant", f"Answer {i}.")
    await engine.drain()
    parts = engine.parts()
    parts.backlog.want_summary(key, 8)
    assert await _summary_step(parts, key, behind)
    state = await engine.store.load(key, recent=2)
    assert state.summary is not None and state.summary.covers_seq >= 8
    notes = [c.outcome for c in call_log().between(0.0) if c.step == "summary" and c.session == key.session_id]
    if behind:  # the offline summariser folded the turns: no model call, a note
        assert summarizer.calls == 0 and notes == ["filled in offline: the model fell behind"]
        assert "the model's summary" not in state.summary.text and "Kyoto" in state.summary.text
    else:
        assert summarizer.calls == 1 and notes == [] and state.summary.text.startswith("the model's summary")
    await engine.close()
