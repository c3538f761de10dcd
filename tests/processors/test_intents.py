"""Seed 000's follow-up intents: keyword priority, English equivalents, templates."""

from __future__ import annotations

import pytest

from contextmode.errors import NoPreviousAnswer
from contextmode.processors.base import IntentKind
from contextmode.processors.intents import (
    INTENT_KEYWORDS,
    INTENT_PRIORITY,
    build_follow_up_prompt,
    classify_follow_up_intent,
)
from contextmode.text import is_chinese

# Seed 000's keyword lists, verbatim.
SEED000: dict[IntentKind, list[str]] = {
    "detail": ["详细", "更多信息", "再讲一遍", "补充", "继续", "扩展", "深入", "再说一遍", "重复一下"],
    "simplify": ["通俗一点", "简单一点", "简略一点", "别太专业", "小白解释", "用比喻", "用例子", "别用术语"],
    "example": ["举个例子", "具体点", "案例", "实例"],
    "summary": ["总结", "概括", "归纳"],
    "pronoun": ["它", "它们", "那些", "这个", "那个", "这些", "这点", "那点"],
}


def test_seed000_keywords_and_priority() -> None:
    assert INTENT_PRIORITY == ("simplify", "detail", "example", "summary", "pronoun")
    for intent, words in SEED000.items():
        assert list(INTENT_KEYWORDS[intent]["zh"]) == words


@pytest.mark.parametrize(("intent", "word"), [(i, w) for i, ws in SEED000.items() for w in ws])
def test_every_seed000_keyword_alone(intent: IntentKind, word: str) -> None:
    assert classify_follow_up_intent(f"请{word}吧") == intent


@pytest.mark.parametrize(
    ("query", "intent"),
    [
        ("举个例子，说得通俗一点", "simplify"),  # simplify > example
        ("详细说说，通俗一点", "simplify"),  # simplify > detail
        ("用例子说明", "simplify"),  # "用例子" is a simplify keyword, tried first
        ("详细总结一下", "detail"),  # detail > summary
        ("举个例子来总结", "example"),  # example > summary
        ("这个能举个例子吗", "example"),  # example > pronoun
        ("总结一下它", "summary"),  # summary > pronoun
        ("它是什么意思", "pronoun"),
        ("今天天气怎么样", None),
        ("", None),
    ],
)
def test_chinese_priority(query: str, intent: IntentKind | None) -> None:
    assert classify_follow_up_intent(query) == intent


@pytest.mark.parametrize(
    ("query", "intent"),
    [
        ("Can you make it simpler?", "simplify"),
        ("Explain like I'm five", "simplify"),
        ("ELI5 please", "simplify"),
        ("Tell me more about it", "detail"),
        ("Please elaborate", "detail"),
        ("Give me an example of that", "example"),
        ("For instance?", "example"),
        ("Summarize it", "summary"),
        ("TL;DR", "summary"),
        ("What does it mean?", "pronoun"),
        ("Are they related?", "pronoun"),
        ("Which one, that one?", "pronoun"),
        ("simpler, with more detail and an example", "simplify"),
        ("more detail, and an example", "detail"),
    ],
)
def test_english_equivalents(query: str, intent: IntentKind) -> None:
    assert classify_follow_up_intent(query) == intent


@pytest.mark.parametrize(
    "query",
    [
        "List the items on sale",  # "items" is not "it"
        "Edit my theme settings",  # "edit", "theme": no "it", no "the"
        "What is the capital of France?",
        "Thesis deadlines are tight",  # "these" only as a word
        "Gothic cathedrals",  # "this", "they" only as words
        "Continuous integration explained",  # "continue" only as a word
        "Recapture the flag",  # "recap" only as a word
    ],
)
def test_english_matches_whole_words_only(query: str) -> None:
    assert classify_follow_up_intent(query) is None


def test_is_chinese() -> None:
    assert is_chinese("hello 你好")
    assert not is_chinese("hello, world! 123")


@pytest.mark.parametrize(
    ("intent", "start"),
    [
        ("detail", "基于以下内容，请进一步详细说明:\n"),
        ("simplify", "请用更简单易懂的语言解释以下内容:\n"),
        ("example", "请基于以下内容举一个具体例子:\n"),
        ("summary", "请对以下内容进行简要总结:\n"),
        ("pronoun", "基于以下内容，请解释‘它是什么’所指的具体内容:\n"),
    ],
)
def test_seed000_templates(intent: IntentKind, start: str) -> None:
    question = "它是什么" if intent == "pronoun" else "再说说"
    prompt = build_follow_up_prompt(intent, "  光合作用把光能变成化学能。 ", f" {question} ")
    assert prompt == f"{start}光合作用把光能变成化学能。\n问题: {question}"


def test_english_templates_follow_the_question_language() -> None:
    prompt = build_follow_up_prompt("example", "Photosynthesis turns light into sugar.",
                                    "for example?")
    assert prompt.startswith("Please give one concrete example based on the following:\n")
    assert prompt.endswith("Photosynthesis turns light into sugar.\nQuestion: for example?")
    forced = build_follow_up_prompt("example", "答案", "for example?", locale="zh-CN")
    assert forced.startswith("请基于以下内容举一个具体例子")


@pytest.mark.parametrize("last_answer", [None, "", "   \n"])
def test_no_previous_answer(last_answer: str | None) -> None:
    with pytest.raises(NoPreviousAnswer, match="当前没有可用的上文信息") as info:
        build_follow_up_prompt("detail", last_answer, "详细说说")
    assert info.value.intent == "detail"


@pytest.mark.parametrize("message", [
    "今天我们去公园玩，然后总结一下经验",
    "Yesterday my boss asked me to summarize the meeting notes for him",
    "老板让我总结一下会议",
    "We went hiking today, then summarized the trip",
])
def test_a_statement_that_only_mentions_summarising_is_no_follow_up(message: str) -> None:
    assert classify_follow_up_intent(message) is None


@pytest.mark.parametrize(("message", "intent"), [
    ("帮我总结一下这周的计划", "summary"), ("Summarize my plan", "summary"), ("总结一下", "summary"),
    ("详细一点", "detail"), ("好的，详细说说", "detail"), ("能详细说说第二点吗？", "detail"),
    ("举个例子", "example"), ("OK, give me an example", "example"), ("Tell me more", "detail"),
])
def test_requests_stay_follow_ups(message: str, intent: str) -> None:
    assert classify_follow_up_intent(message) == intent
