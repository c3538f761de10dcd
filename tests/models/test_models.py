"""Model layer without a network: settings, factory, offline responder, fake models."""

from __future__ import annotations

import pytest

from contextmode.errors import ConfigError, ModelError, UserError
from contextmode.models import (
    ChatModel,
    LLMSettings,
    OfflineResponder,
    check_model_request_allowed,
    model_from_env,
)
from contextmode.models.settings import is_loopback_url
from contextmode.testing.counters import CharTokenCounter
from contextmode.testing.models import BrokenStream, FunctionModel, ScriptedModel
from contextmode.types import ChatMessage

SECRET = "sk-live-abcdefghijklmnop"


def _messages(question: str) -> list[ChatMessage]:
    return [
        ChatMessage(role="system", content="你是助手。" * 100),
        ChatMessage(role="assistant", content="上一轮的回答"),
        ChatMessage(role="user", content=question),
    ]


async def _stream(model: ChatModel, messages: list[ChatMessage]) -> list[str]:
    return [chunk async for chunk in model.stream(messages)]


# -- settings and factory ---------------------------------------------------------------------

def test_settings_from_env_read_every_variable() -> None:
    settings = LLMSettings.from_env({
        "CONTEXTMODE_LLM_BASE_URL": "https://api.deepseek.com",
        "CONTEXTMODE_LLM_API_KEY": SECRET,
        "CONTEXTMODE_LLM_MODEL": "deepseek-chat",
        "CONTEXTMODE_LLM_TIMEOUT": "12.5",
        "CONTEXTMODE_LLM_MAX_RETRIES": "3",
        "CONTEXTMODE_LLM_TEMPERATURE": "0.2",
        "CONTEXTMODE_LLM_EXTRA_HEADERS": '{"X-Org": "acme"}',
    })
    assert settings.configured
    assert (settings.base_url, settings.model, settings.timeout, settings.max_retries) == (
        "https://api.deepseek.com", "deepseek-chat", 12.5, 3)
    assert settings.temperature == 0.2 and settings.extra_headers == {"X-Org": "acme"}
    assert SECRET not in repr(settings) and "api_key=<set>" in repr(settings)
    assert "acme" not in repr(settings)


@pytest.mark.parametrize("env", [
    {"CONTEXTMODE_LLM_BASE_URL": "http://localhost:11434/v1"},
    {"CONTEXTMODE_LLM_MODEL": "m", "CONTEXTMODE_LLM_TIMEOUT": "soon"},
    {"CONTEXTMODE_LLM_MODEL": "m", "CONTEXTMODE_LLM_TIMEOUT": "0"},
    {"CONTEXTMODE_LLM_MODEL": "m", "CONTEXTMODE_LLM_MAX_RETRIES": "1.5"},
    {"CONTEXTMODE_LLM_MODEL": "m", "CONTEXTMODE_LLM_EXTRA_HEADERS": "[1]"},
])
def test_bad_settings_are_config_errors(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        LLMSettings.from_env(env)


def test_factory_is_offline_without_a_model() -> None:
    assert isinstance(model_from_env({}), OfflineResponder)


def test_factory_builds_an_openai_model_when_configured() -> None:
    pytest.importorskip("openai")
    from contextmode.models import OpenAIChatModel

    model = model_from_env({
        "CONTEXTMODE_LLM_BASE_URL": "http://localhost:11434/v1",
        "CONTEXTMODE_LLM_MODEL": "qwen2.5:7b",
        "CONTEXTMODE_LLM_API_KEY": SECRET,
    })
    assert isinstance(model, OpenAIChatModel) and isinstance(model, ChatModel)
    assert model.name == "qwen2.5:7b"
    assert SECRET not in repr(model)


@pytest.mark.parametrize(("url", "loopback"), [
    ("http://127.0.0.1:8000/v1", True), ("http://localhost:11434/v1", True), ("http://[::1]:80/v1", True),
    ("http://127.3.4.5/v1", True), ("https://api.openai.com/v1", False), ("http://10.0.0.2/v1", False),
    (None, False), ("http://localhost.evil.com/v1", False),
])
def test_loopback_detection(url: str | None, loopback: bool) -> None:
    assert is_loopback_url(url) is loopback


def test_request_guard_only_blocks_when_disabled() -> None:
    check_model_request_allowed("https://api.openai.com/v1", {})
    check_model_request_allowed("http://127.0.0.1:1/v1", {"CONTEXTMODE_ALLOW_MODEL_REQUESTS": "0"})
    with pytest.raises(ConfigError, match=r"api\.openai\.com"):
        check_model_request_allowed(None, {"CONTEXTMODE_ALLOW_MODEL_REQUESTS": "false"})


# -- offline responder ------------------------------------------------------------------------

async def test_offline_responder_explains_in_chinese_and_shows_the_request() -> None:
    model = OfflineResponder(counter=CharTokenCounter(), chunk_chars=10)
    messages = _messages("那个按钮在哪?")
    chunks = await _stream(model, messages)
    text = "".join(chunks)
    assert len(chunks) > 5 and all(len(c) <= 10 for c in chunks)
    assert text == await model.complete(messages)
    assert "未配置模型" in text and "CONTEXTMODE_LLM_MODEL" in text
    assert "独立问题：那个按钮在哪?" in text
    assert "3 条消息" in text and "tokens" in text
    assert "1. [system 500 tokens] 你是助手。" in text
    assert "…" in text  # the long system prompt is cut to ~200 characters
    assert "3. [user" in text


async def test_offline_responder_answers_english_in_english() -> None:
    text = await OfflineResponder().complete(_messages("where is that button?"))
    assert text.startswith("(No model configured)")
    assert "Standalone question: where is that button?" in text
    assert "tokens" not in text.split("\n")[4]  # no counter, no totals
    assert isinstance(OfflineResponder(), ChatModel)


# -- fakes -------------------------------------------------------------------------------------

async def test_function_model_computes_the_reply_from_the_messages() -> None:
    model = FunctionModel(lambda messages: f"echo {messages[-1].content}")
    assert await model.complete(_messages("hi"), max_tokens=5) == "echo hi"
    assert model.calls[0].last_user == "hi" and model.calls[0].max_tokens == 5
    assert model.calls[0].method == "complete" and model.calls[0].system.startswith("你是助手")


async def test_function_model_accepts_async_functions_chunks_and_generators() -> None:
    async def async_fn(messages: object) -> list[str]:
        return ["a", "b"]

    async def generator(messages: object):  # type: ignore[no-untyped-def]
        yield "x"
        yield "y"

    assert await _stream(FunctionModel(async_fn), _messages("q")) == ["a", "b"]
    assert await _stream(FunctionModel(generator), _messages("q")) == ["x", "y"]
    assert await FunctionModel(lambda m: iter(["1", "2"])).complete(_messages("q")) == "12"


async def test_fakes_can_fail_like_real_models() -> None:
    model = ScriptedModel([
        "first",
        ["chunk-1", "chunk-2"],
        BrokenStream(chunks=["partial "]),
        ModelError("boom"),
    ])
    assert await model.complete(_messages("1")) == "first"
    assert await _stream(model, _messages("2")) == ["chunk-1", "chunk-2"]
    received: list[str] = []
    with pytest.raises(ModelError):
        async for chunk in model.stream(_messages("3")):
            received.append(chunk)
    assert received == ["partial "]
    with pytest.raises(ModelError, match="boom"):
        await model.complete(_messages("4"))
    with pytest.raises(UserError, match="ran out of replies"):
        await model.complete(_messages("5"))
    assert [call.last_user for call in model.calls] == ["1", "2", "3", "4", "5"]
    assert isinstance(model, ChatModel)


@pytest.mark.parametrize("module_name", [
    "contextmode.models", "contextmode.models.offline", "contextmode.models.openai",
    "contextmode.models.settings", "contextmode.models.factory", "contextmode.jsonparse",
    "contextmode.prompts", "contextmode.processors.llm", "contextmode.testing.models",
    "contextmode.testing.stub_server",
])
def test_public_names_are_complete_and_sorted(module_name: str) -> None:
    import importlib
    import inspect

    module = importlib.import_module(module_name)
    exported = module.__all__
    # isort-style order, as ruff's RUF022 keeps it: CONSTANTS, Classes, functions
    assert exported == sorted(exported, key=lambda n: (not n.isupper(), not n[0].isupper(), n))
    assert all(hasattr(module, name) for name in exported)
    defined = {
        name for name, value in vars(module).items()
        if not name.startswith("_") and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", None) == module_name
    }
    assert defined <= set(exported)


def test_offline_notice_stays_short_for_a_long_context() -> None:
    messages = [ChatMessage(role="system", content="你是助手。")] + [
        ChatMessage(role="user" if i % 2 == 0 else "assistant", content=f"第{i}条消息") for i in range(19)
    ]
    lines = OfflineResponder().render(messages).split("\n")
    listed = [line for line in lines if line[:1].isdigit()]
    assert [line.split(".")[0] for line in listed] == ["1", "16", "17", "18", "19", "20"]
    assert "…（中间另有 14 条）" in lines
    assert len(lines) <= 12
