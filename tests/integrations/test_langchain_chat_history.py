"""`ContextModeChatMessageHistory` against what langchain-core's own chat-history tests
require of a ``BaseChatMessageHistory`` (langchain-ai/langchain,
libs/core/tests/unit_tests/chat_history/test_chat_history.py and
test_file_chat_message_history.py): single and bulk adds land in order, the async
interface reads back what was added and clears, the ``add_user_message`` /
``add_ai_message`` helpers, ``clear``, and a second instance on the same session sees
the history. Written for this adapter (the store is context-mode's, SQLite here)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from contextmode import ContextMode
from contextmode.integrations.langchain import ContextModeChatMessageHistory


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[ContextMode]:
    with ContextMode(store=f"sqlite:///{tmp_path / 'history.db'}") as cm:
        yield cm


@pytest.fixture
def history(memory: ContextMode) -> ContextModeChatMessageHistory:
    return ContextModeChatMessageHistory("chat-history", memory=memory)


def test_add_message_then_add_messages(history: ContextModeChatMessageHistory) -> None:
    history.add_message(HumanMessage(content="Hello"))
    assert history.messages == [HumanMessage(content="Hello")]
    history.add_message(HumanMessage(content="World"))
    assert history.messages[1] == HumanMessage(content="World")
    history.add_messages([HumanMessage(content="Hello"), HumanMessage(content="World")])
    assert history.messages == [HumanMessage(content=t) for t in ("Hello", "World", "Hello", "World")]


async def test_async_interface(history: ContextModeChatMessageHistory) -> None:
    await history.aadd_messages([HumanMessage(content="Hello"), HumanMessage(content="World")])
    assert await history.aget_messages() == [HumanMessage(content="Hello"), HumanMessage(content="World")]
    await history.aadd_messages([HumanMessage(content="!")])
    assert await history.aget_messages() == [
        HumanMessage(content="Hello"), HumanMessage(content="World"), HumanMessage(content="!")]
    await history.aclear()
    assert await history.aget_messages() == []


def test_user_and_ai_helpers(history: ContextModeChatMessageHistory) -> None:
    history.add_user_message("Hello!")
    history.add_ai_message("Hi there!")
    messages = history.messages
    assert len(messages) == 2
    assert isinstance(messages[0], HumanMessage) and isinstance(messages[1], AIMessage)
    assert [m.content for m in messages] == ["Hello!", "Hi there!"]


def test_clear(history: ContextModeChatMessageHistory) -> None:
    history.add_user_message("Hello!")
    history.add_ai_message("Hi there!")
    history.clear()
    assert history.messages == []


def test_a_second_instance_sees_the_history(memory: ContextMode, history: ContextModeChatMessageHistory) -> None:
    said = ["Hello, AI!", "Hello, how can I help you?", "Tell me a joke.",
            "Why did the chicken cross the road? To get to the other side!"]
    for i, text in enumerate(said):
        (history.add_user_message if i % 2 == 0 else history.add_ai_message)(text)
    assert [m.content for m in history.messages] == said
    again = ContextModeChatMessageHistory("chat-history", memory=memory)
    assert [m.content for m in again.messages] == said
    assert ContextModeChatMessageHistory("another-session", memory=memory).messages == []


def test_str_lists_the_messages(history: ContextModeChatMessageHistory) -> None:
    history.add_user_message("Hello!")
    assert "Hello!" in str(history)
