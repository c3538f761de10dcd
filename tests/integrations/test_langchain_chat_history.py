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
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import ConfigurableFieldSpec, RunnableConfig, RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory

from contextmode import ContextMode
from contextmode.errors import InvalidSessionId
from contextmode.integrations.langchain import ContextModeChatMessageHistory
from contextmode.session_keys import id_for_key, key_for_id
from contextmode.types import validate_id


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


# -- any key the framework makes (RunnableWithMessageHistory with custom config specs) --------


def _keyed_chain(memory: ContextMode) -> RunnableWithMessageHistory:
    """LangChain's documented pattern: the history keyed by ``user_id`` and ``conversation_id``."""

    def reply(inputs: dict[str, Any]) -> AIMessage:
        history = inputs["history"]
        return AIMessage(content=f"I have {len(history)} earlier messages; you said {inputs['question']}")

    return RunnableWithMessageHistory(
        RunnableLambda(reply),
        lambda user_id, conversation_id: ContextModeChatMessageHistory(f"{user_id}/{conversation_id}", memory=memory),
        input_messages_key="question",
        history_messages_key="history",
        history_factory_config=[
            ConfigurableFieldSpec(id="user_id", annotation=str, name="User ID", default="", is_shared=True),
            ConfigurableFieldSpec(id="conversation_id", annotation=str, name="Conversation ID", default="",
                                  is_shared=True),
        ],
    )


def _config(user: str, conversation: str) -> RunnableConfig:
    return {"configurable": {"user_id": user, "conversation_id": conversation}}


def test_custom_config_specs_keys_sync(memory: ContextMode) -> None:
    chain = _keyed_chain(memory)
    first = chain.invoke({"question": "hello"}, _config("user1", "1-1dc5acabaf"))
    assert first.content == "I have 0 earlier messages; you said hello"
    second = chain.invoke({"question": "again"}, _config("user1", "1-1dc5acabaf"))
    assert second.content == "I have 2 earlier messages; you said again"
    other = chain.invoke({"question": "hi"}, _config("user2", "1-1dc5acabaf"))
    assert other.content == "I have 0 earlier messages; you said hi"
    history = ContextModeChatMessageHistory("user1/1-1dc5acabaf", memory=memory)
    assert history.session_id == "user1/1-1dc5acabaf"
    assert [m.content for m in history.messages] == ["hello", first.content, "again", second.content]
    # stored under a valid id that reads back as the key
    stored = id_for_key("user1/1-1dc5acabaf")
    assert stored != "user1/1-1dc5acabaf" and validate_id(stored) == stored
    assert key_for_id(stored) == "user1/1-1dc5acabaf"
    assert len(memory.turns(stored)) == 4


async def test_custom_config_specs_keys_async(memory: ContextMode) -> None:
    chain = _keyed_chain(memory)
    await chain.ainvoke({"question": "你好"}, _config("用户 1", "对话/一"))
    second = await chain.ainvoke({"question": "再来"}, _config("用户 1", "对话/一"))
    assert second.content == "I have 2 earlier messages; you said 再来"
    history = ContextModeChatMessageHistory("用户 1/对话/一", memory=memory)
    assert [m.content for m in await history.aget_messages()][::2] == ["你好", "再来"]


@pytest.mark.parametrize("key", ["user-42", "user1/1-1dc5acabaf", "", ".", "..", "_.x", "a b", "名字@example.com",
                                 "/_0123456789abcdef", "x" * 127, "\U0001f600" * 3, "a\nb\x00c"])
def test_every_key_maps_to_a_valid_id_and_back(key: str) -> None:
    stored = id_for_key(key)
    assert validate_id(stored) == stored
    assert key_for_id(stored) == key
    if validate_id_ok(key) and not key.startswith("_."):
        assert stored == key, "a valid id is its own id"


def validate_id_ok(key: str) -> bool:
    try:
        validate_id(key)
    except InvalidSessionId:
        return False
    return True


def test_long_keys_stay_apart() -> None:
    a, b = "k" * 300 + "a", "k" * 300 + "b"
    assert id_for_key(a) != id_for_key(b)
    assert len(id_for_key(a)) == 128 and validate_id(id_for_key(a))
    assert key_for_id(id_for_key(a)).endswith("…") and key_for_id(id_for_key(a)).startswith("k" * 100)
