"""A real local model end to end: SmolLM2-135M-Instruct behind llama-cpp-python's server,
``contextmode serve`` with ``CONTEXTMODE_PROCESSORS=llm`` in front, an English and a Chinese
conversation. Needs the ``local-model`` extra; under a truthy ``CI`` a missing extra fails.

Run alone with ``pytest -m local_model``. Replies and processor calls are capped small
(``max_tokens``) so the whole module takes a couple of minutes on two cores.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from contextmode.testing.ci import skip_or_fail
from contextmode.testing.local_model import (
    CONVERSATIONS,
    llama_server,
    local_model_ready,
    prompt_text_in,
    run_conversation,
    service,
    settle,
    ungrounded_pins,
)

pytestmark = [pytest.mark.local_model, pytest.mark.slow]

TURNS = 5
FOLLOW_UP = 4  # index of "Is it usually affordable?" / "那个贵不贵？"
SMALL = {
    "CONTEXTMODE_LLM_REPLY_MAX_TOKENS": "48",
    "CONTEXTMODE_LLM_SUMMARY_MAX_TOKENS": "96",
    "CONTEXTMODE_LLM_CONSTRAINTS_MAX_TOKENS": "96",
    "CONTEXTMODE_LLM_REWRITE_MAX_TOKENS": "48",
    "CONTEXTMODE_LLM_TEMPERATURE": "0",
    "CONTEXTMODE_SUMMARY_THRESHOLD": "2",
    "CONTEXTMODE_JOB_ATTEMPTS": "2",
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    missing = local_model_ready()
    if missing is not None:
        skip_or_fail(f"the local-model extra is missing: {missing}")
    logs = tmp_path_factory.mktemp("local-model")
    with llama_server(logs) as base_url, service(base_url, logs, env=SMALL) as worker:
        yield worker.url


@pytest.mark.parametrize("language", ["en", "zh"])
def test_a_real_model_conversation_keeps_every_property(served: str, language: str) -> None:
    import httpx

    said = list(CONVERSATIONS[language][:TURNS])
    session = f"real-{language}"
    runs = run_conversation(served, session, said[:FOLLOW_UP])
    # The follow-up reaches the model in the user's words.
    context = httpx.get(f"{served}/v1/sessions/{session}/context", params={"message": said[FOLLOW_UP]},
                        timeout=300).json()["data"]
    last_user = [m for m in context["messages"] if m["role"] == "user"][-1]["content"]
    assert context["original_message"] == said[FOLLOW_UP]
    if said[FOLLOW_UP] not in last_user:  # rewritten: it may replace pronouns, never drop the user's words
        rewrite = context["rewrite"]
        assert rewrite is not None and rewrite["changed"] and rewrite["text"] in last_user
        words = re.findall(r"[a-z]{3,}|\d+|[\u4e00-\u9fff]", said[FOLLOW_UP].lower())
        assert all(w in last_user.lower() for w in words), (said[FOLLOW_UP], last_user)
    runs += run_conversation(served, session, said[FOLLOW_UP:])
    # Every turn answered, none errored, each one bounded.
    assert [r.status for r in runs] == [200] * TURNS, [(r.status, r.answer[:80]) for r in runs]
    assert all(r.answer.strip() for r in runs)
    data = settle(served, session)
    # Pins hold only what the user said; nothing stored holds prompt text.
    assert ungrounded_pins(data["constraints"], said) == []
    for c in data["constraints"]:
        assert prompt_text_in(f"{c['value']} {c['quote']}", said) is None, c
    if data["summary"]:
        assert prompt_text_in(data["summary"]["text"], said) is None, data["summary"]["text"]
    # Every job ended ok or as a counted failure/rejection, with nothing left pending. One waiting
    # job per session covers every turn since the last that ran (the backlog), so a kind of job
    # runs at most once a turn; every user turn is scored unless a run failed.
    jobs = data["stats"]["jobs"]
    assert data["stats"]["pending_jobs"] == []
    for kind in ("emotion", "constraints"):
        ran = jobs[kind]["ok"] + jobs[kind]["failed"] + jobs[kind]["rejected"]
        assert 1 <= ran <= TURNS, (kind, jobs[kind])
    if not jobs["emotion"]["failed"]:
        unscored = [t["seq"] for t in data["turns"] if t["role"] == "user" and t["emotion"] is None]
        assert unscored == [], (unscored, jobs["emotion"])
    for name, stats in jobs.items():
        # A failed or rejected run records its reason; a later ok run clears it (the store contract:
        # `last_error` is the last run's), so a job whose last run was ok may show none.
        if stats["rejected"] or stats["failed"]:
            assert stats["last_error"] or stats["ok"], (name, stats)


def test_the_server_window_and_tokenizer_are_used(served: str) -> None:
    import httpx

    context = httpx.get(f"{served}/v1/sessions/real-probe/context", params={"message": "hello"},
                        timeout=60).json()["data"]
    assert context["input_budget"] + context["reply_reserve"] <= 4096
    # the server's own tokenizer (exact), or the estimate while the server was busy, and it says so
    assert context["counter"].startswith("server:")
    assert isinstance(context["exact"], bool)


def test_the_readme_quick_start_names_the_extra() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "local-model]'" in readme and "CONTEXTMODE_PROCESSORS=llm" in readme
