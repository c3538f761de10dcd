"""LLM-backed processors with fake models, and once over real HTTP through the stub server."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from contextmode.errors import ModelError, ModelTimeout, ModelUnavailable, OutputRejected
from contextmode.processors.base import (
    ConstraintExtractor,
    ConstraintUpdate,
    ContextDetector,
    Detection,
    EmotionScorer,
    Rewrite,
    Rewriter,
    Summarizer,
    SummaryResult,
)
from contextmode.processors.llm import (
    LLMConstraintExtractor,
    LLMContextDetector,
    LLMEmotionScorer,
    LLMRewriter,
    LLMSummarizer,
    clean_model_text,
    parse_intensity,
    parse_yes_no,
)
from contextmode.prompts import PROMPTS
from contextmode.testing.models import FunctionModel, ScriptedModel
from contextmode.types import ChatMessage, Constraint, Summary, Turn


def turn(seq: int, role: str, content: str) -> Turn:
    return Turn(seq=seq, role=role, content=content, tokens=len(content),  # type: ignore[arg-type]
                created_at=datetime(2026, 6, 9, 10, seq, tzinfo=UTC))


HISTORY = [
    turn(1, "user", "空调制冷差怎么办?"),
    turn(2, "assistant", "可以尝试：1. 清洗滤网；2. 开启极速制冷按钮；3. 检查室外机。"),
]


def test_every_processor_satisfies_its_protocol() -> None:
    model = ScriptedModel([])
    assert isinstance(LLMContextDetector(model), ContextDetector)
    assert isinstance(LLMRewriter(model), Rewriter)
    assert isinstance(LLMSummarizer(model), Summarizer)
    assert isinstance(LLMConstraintExtractor(model), ConstraintExtractor)
    assert isinstance(LLMEmotionScorer(model), EmotionScorer)


def test_prompts_are_versioned_and_render_in_both_languages() -> None:
    fields = dict(history="h", message="m", summary="s", previous="p", turns="t", target_length=300,
                  current="c", text="x")
    for prompt in PROMPTS.values():
        assert prompt.tag == f"{prompt.name}@{prompt.version}"
        zh, en = prompt.render(chinese=True, **fields), prompt.render(chinese=False, **fields)
        assert [m.role for m in zh] == ["system", "user"] == [m.role for m in en]
        assert any("\u4e00" <= ch <= "\u9fff" for ch in zh[0].content)
    summary = PROMPTS["summary"].render(chinese=True, **fields)[0].content
    for must_keep in ("偏好", "未完成的任务", "数字", "情绪强度（1-5）"):
        assert must_keep in summary
    assert '{"upsert": [' in PROMPTS["constraints"].render(chinese=True, **fields)[0].content


# -- parsing helpers ----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "verdict"), [
    ("yes", True), ("Yes.", True), ("no", False), ("NO", False), ("需要", True), ("不需要。", False),
    ("是", True), ("否", False), ('{"needs_context": true}', True), ('```json\n{"needs_context": "no"}\n```', False),
    ("Answer: yes", True), ("I think the answer is no.", False), ("none of that", None), ("maybe", None),
])
def test_parse_yes_no(text: str, verdict: bool | None) -> None:
    assert parse_yes_no(text) is verdict


@pytest.mark.parametrize(("text", "value"), [
    ('{"intensity": 0.8, "emotion": "悲伤"}', 0.8), ("0.35", 0.35), ("70%", 0.7), ("4/5", 0.8),
    ('{"intensity": 1.7}', 1.0), ('{"intensity": -2}', 0.0), ("```json\n{'score': '0.6',}\n```", 0.6),
    ("强度：0.9", 0.9), ("no idea", None), ('{"intensity": true}', None),
])
def test_parse_intensity_clamps_to_unit_range(text: str, value: float | None) -> None:
    result = parse_intensity(text)
    assert result == (pytest.approx(value) if value is not None else None)


@pytest.mark.parametrize(("raw", "clean"), [
    ('"空调遥控器上的极速制冷按钮在哪里?"', "空调遥控器上的极速制冷按钮在哪里?"),
    ("改写后的问题：空调遥控器上的极速制冷按钮在哪里?", "空调遥控器上的极速制冷按钮在哪里?"),
    ("**Standalone question:** 'Where is the button?'", "Where is the button?"),
    ("「怎么清洗空调滤网？」", "怎么清洗空调滤网？"),
    ("```\n摘要：用户预算50元\n```", "用户预算50元"),
])
def test_clean_model_text(raw: str, clean: str) -> None:
    assert clean_model_text(raw) == clean


# -- detector -----------------------------------------------------------------------------------

async def test_detector_parses_the_verdict_and_adds_the_keyword_intent() -> None:
    model = ScriptedModel(["yes", "No."])
    detector = LLMContextDetector(model)
    detection = await detector.detect("举个例子", HISTORY)
    assert detection.needs_context and detection.intent == "example" and detection.score > 0.5
    assert "detect@1" in detection.reason
    assert "举个例子" in model.calls[0].last_user and "清洗滤网" in model.calls[0].last_user
    assert not (await detector.detect("今天天气怎么样?", HISTORY)).needs_context


async def test_detector_skips_the_model_without_history() -> None:
    model = ScriptedModel([])
    assert (await LLMContextDetector(model).detect("那个呢?", [])).needs_context is False
    assert model.calls == []


class _Fixed:
    def __init__(self, detection: Detection) -> None:
        self.detection = detection

    async def detect(self, message: str, history: Sequence[Turn]) -> Detection:
        return self.detection


async def test_detector_falls_back_on_garbage_and_model_errors() -> None:
    fallback = _Fixed(Detection(needs_context=True, reason="offline"))
    detector = LLMContextDetector(ScriptedModel(["hmm, hard to say", ModelTimeout("slow")]), fallback=fallback)
    assert (await detector.detect("那个呢?", HISTORY)).reason == "offline, the model gave no verdict: offline"
    assert (await detector.detect("那个呢?", HISTORY)).reason == "offline, the model gave no verdict: offline"
    bare = LLMContextDetector(ScriptedModel(["???", ModelError("down")]))
    assert (await bare.detect("那个呢?", HISTORY)).needs_context is False
    assert (await bare.detect("那个呢?", HISTORY)).needs_context is False


# -- rewriter -----------------------------------------------------------------------------------

async def test_rewriter_returns_the_models_standalone_question() -> None:
    model = ScriptedModel(["改写后的问题：“空调遥控器上的极速制冷按钮在哪里?”\n\n说明：把“那个按钮”替换成了……"])
    rewrite = await LLMRewriter(model).rewrite("那个按钮在哪?", HISTORY, summary="用户的空调制冷差")
    assert rewrite == Rewrite(text="空调遥控器上的极速制冷按钮在哪里?", changed=True, source="llm")
    prompt = model.calls[0].last_user
    assert "用户的空调制冷差" in prompt and "极速制冷按钮" in prompt and "那个按钮在哪?" in prompt


async def test_rewriter_keeps_the_message_when_the_model_echoes_it_or_fails() -> None:
    model = ScriptedModel(['"How do I clean the filter?"', "", ModelUnavailable("HTTP 503"), "x" * 2000])
    rewriter = LLMRewriter(model)
    history = [turn(1, "user", "my AC is weak"), turn(2, "assistant", "clean the filter")]
    assert await rewriter.rewrite("How do I clean the filter?", history) == Rewrite(
        text="How do I clean the filter?", changed=False, source="llm")
    for _ in range(3):  # empty answer, model error, an essay instead of a question
        result = await rewriter.rewrite("how?", history)
        assert result == Rewrite(text="how?", changed=False, source="llm")
    assert await rewriter.rewrite("hello", []) == Rewrite(text="hello", changed=False, source="llm")
    assert len(model.calls) == 4


# -- summarizer ---------------------------------------------------------------------------------

async def test_summarizer_folds_turns_into_the_previous_summary() -> None:
    model = FunctionModel(lambda messages: "摘要：用户家在南方，空调制冷差，预算3000元；用户说“我今天很难过”（情绪强度4）。")
    previous = Summary(text="用户家在南方。", covers_seq=0, tokens=7)
    turns = [turn(1, "user", "我今天很难过，空调坏了，预算3000元"), turn(2, "assistant", "别难过，我们一起看看。")]
    result = await LLMSummarizer(model, target_length=150).summarize(previous, turns)
    assert result == SummaryResult(text="用户家在南方，空调制冷差，预算3000元；用户说“我今天很难过”（情绪强度4）。")
    system, user = model.calls[0].messages
    assert "150" in system.content and "情绪强度（1-5）" in system.content
    assert "用户家在南方。" in user.content and "[06-09 10:01] 用户: 我今天很难过" in user.content


async def test_summary_keeps_the_previous_summarys_facts() -> None:
    model = ScriptedModel(["用户想买手机，预算3000元。", "The user wants a cheap phone."])
    previous = Summary(text="用户住在北京，预算3000元，不吃辣。\n要点: 周五下午3点开会", covers_seq=2, tokens=20)
    result = await LLMSummarizer(model).summarize(previous, [turn(3, "user", "我想买手机")])
    assert result.text.startswith("用户想买手机，预算3000元。\n要点: 周五下午3点开会；")
    assert "不吃辣" in result.restored_facts and "周五下午3点开会" in result.restored_facts
    assert not any("3000" in fact for fact in result.restored_facts)  # the model kept it
    previous = Summary(text="Budget is 450 dollars. The meeting is at 3pm.", covers_seq=2, tokens=9)
    result = await LLMSummarizer(model).summarize(previous, [turn(3, "user", "I want a phone"),
                                                             turn(4, "assistant", "Option 1 costs 999.")])
    assert result.text.startswith("The user wants a cheap phone.\nFacts: ")
    assert "450" in result.text and "3pm" in result.text
    assert "999" not in result.text  # new turns are AuditedSummarizer's job, not this one's


async def test_summarizer_raises_for_a_retry_or_uses_its_fallback() -> None:
    turns = [turn(1, "user", "hello")]
    with pytest.raises(ModelError):
        await LLMSummarizer(ScriptedModel([ModelTimeout("slow")])).summarize(None, turns)
    with pytest.raises(ModelError, match="empty summary"):
        await LLMSummarizer(ScriptedModel(["```\n```"])).summarize(None, turns)

    class Offline:
        async def summarize(self, previous: Summary | None, turns: Sequence[Turn]) -> SummaryResult:
            return SummaryResult(text="offline summary")

    summarizer = LLMSummarizer(ScriptedModel([ModelTimeout("slow")]), fallback=Offline())
    assert (await summarizer.summarize(None, turns)).text == "offline summary"
    previous = Summary(text="kept", covers_seq=1, tokens=1)
    assert (await LLMSummarizer(ScriptedModel([])).summarize(previous, [])).text == "kept"


# -- constraint extraction ---------------------------------------------------------------------

async def test_constraints_are_parsed_tolerantly_into_an_update() -> None:
    answer = """好的，提取结果如下：
```json
{"upsert": [
    {"key": "Spice", "value": "不吃辣", "kind": "Preference", "quote": "我不吃辣"},
    {"key": "budget", "value": "五十以内", "kind": "constraint", "quote": "价格控制在五十以内",},
],
 "remove": ["location", "spice", "never_stored"],}
```
以上。"""
    model = ScriptedModel([answer])
    user_turn = turn(5, "user", "我不吃辣，价格控制在五十以内")
    current = [Constraint(key="location", value="住在北京")]
    update = await LLMConstraintExtractor(model).extract(user_turn, current)
    assert update == ConstraintUpdate(
        upsert=(
            Constraint(key="spice", value="不吃辣", kind="preference", source_seq=5, quote="我不吃辣"),
            Constraint(key="budget", value="五十以内", kind="constraint", source_seq=5, quote="价格控制在五十以内"),
        ),
        remove_keys=("location",),  # only remembered keys can be removed
    )
    assert "location: 住在北京" in model.calls[0].last_user


@pytest.mark.parametrize("answer", [
    '{"constraints": {"spice": {"value": "不要辣", "quote": "不要辣"}}}',
    '[{"key": "spice", "value": "不要辣", "quote": "我不要辣的"}]',
    "{'upsert': [{'key': 'spice', 'value': '不要辣', 'quote': '不要辣',}]}",
])
async def test_constraint_shapes_models_actually_produce(answer: str) -> None:
    update = await LLMConstraintExtractor(ScriptedModel([answer])).extract(turn(1, "user", "我不要辣的"), [])
    assert [(c.key, c.value) for c in update.upsert] == [("spice", "不要辣")]


@pytest.mark.parametrize(("message", "answer", "reason"), [
    ("hi there", "I could not find any constraints.", "no JSON"),
    ("hi there", '{"upsert": "nonsense"}', "schema"),
    ("hi there", '["just", "words"]', "schema"),
    ("我不吃辣", '{"upsert": [{"key": "spice", "value": "不吃辣", "kind": "hard", "quote": "我不吃辣"}]}', "schema"),
    ("我不吃辣", '{"upsert": [{"key": "", "value": "不吃辣", "kind": "fact", "quote": "我不吃辣"}]}', "schema"),
    # the prompt's own examples, for users who said something else
    ("I'm vegetarian, 30 dollars per person",
     '{"upsert": [{"key": "spice", "value": "no spicy food", "kind": "preference", "quote": "I can\'t eat spicy"}]}',
     "not in the user's words"),
    ("I'm vegetarian, 30 dollars per person",
     '{"upsert": [{"key": "budget", "value": "under $50", "kind": "constraint", "quote": "30 dollars per person"}]}',
     "numbers the user never said (50)"),
    ("对海鲜过敏，预算两百以内",
     '{"upsert": [{"key": "spice", "value": "不要辣", "kind": "preference", "quote": "对海鲜过敏"}]}',
     "not in the user's words"),
    # empty and markup quotes
    ("I'm vegetarian", '{"upsert": [{"key": "diet", "value": "vegetarian", "kind": "fact", "quote": ""}]}',
     "empty quote"),
    ("I can't eat spicy", '{"upsert": [{"key": "spice", "value": "no spicy", "quote": "<b>I can\'t eat spicy"}]}',
     "markup in the quote"),
])
async def test_invalid_constraint_output_is_rejected_with_a_reason(message: str, answer: str, reason: str) -> None:
    with pytest.raises(OutputRejected) as caught:
        await LLMConstraintExtractor(ScriptedModel([answer])).extract(turn(1, "user", message), [])
    assert reason in caught.value.reason


async def test_grounded_values_in_other_spellings_are_kept() -> None:
    answer = ('{"upsert": [{"key": "budget", "value": "200以内", "kind": "constraint", "quote": "预算两百以内"},'
              ' {"key": "allergy:seafood", "value": "海鲜过敏", "kind": "fact", "quote": "对海鲜过敏"}], "remove": []}')
    update = await LLMConstraintExtractor(ScriptedModel([answer])).extract(turn(1, "user", "对海鲜过敏，预算两百以内"), [])
    assert [c.value for c in update.upsert] == ["200以内", "海鲜过敏"]


async def test_rejected_constraint_output_uses_the_fallback_when_there_is_one() -> None:
    class Offline:
        async def extract(self, turn: Turn, current: Sequence[Constraint]) -> ConstraintUpdate:
            return ConstraintUpdate(remove_keys=("x",))

    extractor = LLMConstraintExtractor(ScriptedModel(["no json"]), fallback=Offline())
    assert await extractor.extract(turn(1, "user", "hi"), []) == ConstraintUpdate(remove_keys=("x",))
    assert await LLMConstraintExtractor(ScriptedModel([])).extract(turn(2, "assistant", "我不吃辣"), []) == (
        ConstraintUpdate())


async def test_constraint_model_errors_raise_for_a_retry() -> None:
    with pytest.raises(ModelTimeout):
        await LLMConstraintExtractor(ScriptedModel([ModelTimeout("slow")])).extract(turn(1, "user", "x"), [])


# -- emotion -----------------------------------------------------------------------------------

async def test_emotion_scores_are_parsed_and_clamped() -> None:
    model = ScriptedModel(['{"intensity": 0.85, "emotion": "绝望"}', "```json\n{\"intensity\": 3}\n```", "no idea"])
    scorer = LLMEmotionScorer(model)
    assert await scorer.score("我真的撑不下去了") == pytest.approx(0.85)
    assert await scorer.score("I'm furious") == 1.0
    with pytest.raises(OutputRejected, match="no intensity"):
        await scorer.score("ok")
    assert await scorer.score("   ") == 0.0
    assert len(model.calls) == 3
    assert "撑不下去" in model.calls[0].last_user


async def test_emotion_uses_the_fallback_for_garbage_and_errors() -> None:
    class Offline:
        async def score(self, text: str) -> float:
            return 0.42

    scorer = LLMEmotionScorer(ScriptedModel(["???", ModelTimeout("slow")]), fallback=Offline())
    assert await scorer.score("唉") == 0.42
    assert await scorer.score("唉") == 0.42
    with pytest.raises(ModelTimeout):
        await LLMEmotionScorer(ScriptedModel([ModelTimeout("slow")])).score("唉")


# -- over real HTTP ----------------------------------------------------------------------------

async def test_processors_over_the_stub_server_survive_malformed_json() -> None:
    pytest.importorskip("openai")
    from contextmode.models import OpenAIChatModel
    from contextmode.testing.stub_server import StubRequest, StubServer

    def reply(request: StubRequest) -> str:
        system = request.messages[0]["content"]
        if "JSON" in system and "upsert" in system:
            return '{"upsert": [{"key": "spice", "value": "不要辣", "quote": "我不吃辣'  # cut off mid-object
        if "JSON" in system:
            return "情绪强度大概是 {intensity: 很高}"  # not a number
        return "那个按钮"

    server = StubServer(reply)
    with server as url:
        model = OpenAIChatModel(model="stub-model", base_url=url, max_retries=0, timeout=2)
        update = await LLMConstraintExtractor(model).extract(turn(1, "user", "我不吃辣"), [])
        assert [(c.key, c.value) for c in update.upsert] == [("spice", "不要辣")]
        with pytest.raises(OutputRejected):
            await LLMEmotionScorer(model).score("我很难过")
        server.malformed_next()  # a broken HTTP body: the rewrite keeps the message
        rewrite = await LLMRewriter(model).rewrite("那个按钮在哪?", HISTORY)
        assert rewrite == Rewrite(text="那个按钮在哪?", changed=False, source="llm")
        detection = await LLMContextDetector(model).detect("那个按钮在哪?", HISTORY)
        assert detection.needs_context is False  # "那个按钮" is no verdict
        assert len(server.chat_requests) == 4
        # The response path streams, to stop once its line or verdict is in; JSON comes whole.
        assert [r.stream for r in server.chat_requests] == [False, False, True, True]
        assert isinstance(server.chat_requests[0].body["messages"][0], dict)
        assert ChatMessage  # the processors send plain chat messages through the model


async def test_response_path_processors_give_up_after_their_timeout() -> None:
    import asyncio

    async def slow(messages: object) -> str:
        await asyncio.sleep(5)
        return "yes"

    model = FunctionModel(slow)
    detection = await LLMContextDetector(model, timeout=0.05).detect("那个呢?", HISTORY)
    assert detection.needs_context is False
    rewrite = await LLMRewriter(model, timeout=0.05).rewrite("那个呢?", HISTORY)
    assert rewrite == Rewrite(text="那个呢?", changed=False, source="llm")
