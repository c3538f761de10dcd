"""Offline rewriter: pronouns resolved in tiny dialogues, standalone questions untouched."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from contextmode.processors.base import Rewriter
from contextmode.processors.rewrite import OfflineRewriter, salient_entities
from contextmode.types import Turn

ZH = ["你知道王菲吗", "王菲是歌坛天后，她的歌很好听。"]
EN = ["Tell me about Frank Zappa", "Frank Zappa was an American musician. Zappa formed a band."]


def _turns(texts: list[str]) -> list[Turn]:
    now = datetime.now(UTC)
    return [Turn(seq=i + 1, role="user" if i % 2 == 0 else "assistant", content=t, tokens=0,
                 created_at=now) for i, t in enumerate(texts)]


def test_implements_the_protocol() -> None:
    assert isinstance(OfflineRewriter(), Rewriter)


async def test_chinese_pronoun_resolved() -> None:
    result = await OfflineRewriter().rewrite("她老公是谁", _turns(ZH))
    assert result.changed
    assert result.text == "王菲老公是谁"
    assert result.source == "offline"


async def test_english_pronoun_resolved() -> None:
    result = await OfflineRewriter().rewrite("When was he born?", _turns(EN))
    assert result.text == "When was Frank Zappa born?"
    possessive = await OfflineRewriter().rewrite("What about his wife?", _turns(EN))
    assert possessive.text == "What about Frank Zappa's wife?"


def test_thing_pronoun_and_place() -> None:
    rewriter = OfflineRewriter()
    assert rewriter.rewrite_texts("它多少钱", ["我想买iPhone", "iPhone很不错"]).text.startswith(
        "iPhone")
    placed = rewriter.rewrite_texts("那里好玩吗", ["我下周去杭州", "杭州的西湖很美"])
    assert placed.text == "杭州那里好玩吗"


@pytest.mark.parametrize(
    ("message", "history"),
    [("北京今天天气怎么样", ZH), ("What is the capital of France?", EN),
     ("When was Frank Zappa born?", EN), ("她老公是谁", [])],
)
def test_standalone_left_unchanged(message: str, history: list[str]) -> None:
    result = OfflineRewriter().rewrite_texts(message, history)
    assert not result.changed
    assert result.text == message


def test_unconfident_antecedent_is_not_inserted() -> None:
    # "天气" is a plain noun mentioned once: not confident enough to replace 它.
    assert not OfflineRewriter().rewrite_texts("它怎么样", ["今天天气"]).changed


async def test_summary_used_when_no_turns() -> None:
    result = await OfflineRewriter().rewrite("When was he born?", [],
                                            summary="The user asked about Frank Zappa.")
    assert result.text == "When was Frank Zappa born?"


def test_salient_entities_fold_short_names() -> None:
    ranked = salient_entities("did he win?", EN)
    assert ranked[0].text == "Frank Zappa"
    assert ranked[0].turns == 2 and ranked[0].confident


def test_short_answer_takes_the_question_object() -> None:
    rewriter = OfflineRewriter()
    assert rewriter.rewrite_texts("不在", ["你好", "在不在武汉"]).text == "不在武汉"
    assert rewriter.rewrite_texts("不会", ["你不会腻吗"]).text == "不会腻"
    # a particle at the end is no anchor: left alone
    assert not rewriter.rewrite_texts("是的", ["你是学生吗"]).changed


def test_subject_ellipsis_is_off_by_default() -> None:
    # Precision first: a predicate alone is left as the user wrote it unless asked for.
    assert not OfflineRewriter().rewrite_texts("真好看", ["我昨天买了一个新手机"]).changed
    assert OfflineRewriter(ellipsis=True, ellipsis_min_turns=1).rewrite_texts(
        "真好看", ["我昨天买了一个新手机"]).text == "新手机真好看"


def test_answer_to_a_question_gets_no_subject() -> None:
    # After a yes/no question the short message is an answer, not an ellipsis.
    assert not OfflineRewriter().rewrite_texts("挺好的", ["新手机好用吗"]).changed


def test_a_contraction_is_never_an_antecedent() -> None:
    rewriter = OfflineRewriter()
    context = ["I've been reading a lot lately.", "That's great! What are you reading?",
               "I've started a novel, I've loved it so far."]
    result = rewriter.rewrite_texts("What was it about", context)
    assert not result.changed and result.text == "What was it about"
    named = rewriter.rewrite_texts("What was it about", ["I watched Inception last night.", "Did you like Inception?"])
    assert named.text == "What was Inception about"


def test_a_capital_that_only_opens_a_sentence_is_no_name() -> None:
    """"Suggest a dinner place" capitalises a verb: "Where is it?" after it is left alone (it
    was "Where is Suggest?"). A word capitalised inside a sentence too is a name wherever it
    stands ("Boston is lovely" after "I live in Boston")."""
    rewriter = OfflineRewriter()
    history = ["I'm vegetarian and my budget is $20 per meal", "Suggest a dinner place"]
    assert not rewriter.rewrite_texts("Where is it?", history).changed
    assert [a.text for a in salient_entities("Where is it?", history)] == []
    placed = salient_entities("Is it expensive?", ["I live in Boston", "Boston is lovely in May."])
    assert placed[0].text == "Boston" and placed[0].turns == 2
    # A name of several words opening a sentence is still a name.
    assert salient_entities("When was he born?", ["Frank Zappa was a musician."])[0].text == "Frank Zappa"
