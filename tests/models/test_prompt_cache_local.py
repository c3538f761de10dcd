"""A real llama.cpp server (llama-cpp-python's, SmolLM2-135M) reuses its prompt cache for the
second turn of a session: the request repeats the first one's prefix byte for byte (instructions,
then the turns), the engine asks for ``cache_prompt``, and the server evaluates only what is new.

llama-cpp-python's server reports no cached-token count in its usage; it says in its log how
many prompt tokens of the previous request it kept (``Llama.generate: N prefix-match hit``),
which is what is checked. Time to first token of both turns is printed, never asserted.
Needs the ``local-model`` extra (under a truthy ``CI`` a missing extra fails).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from contextmode.testing.ci import skip_or_fail
from contextmode.testing.local_model import LOCAL_MODEL_ALIAS, llama_server, local_model_ready

pytestmark = [pytest.mark.local_model, pytest.mark.slow]

_HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens to eval")
_PROMPT = re.compile(r"prompt eval time = .*?/\s*(\d+) tokens")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    missing = local_model_ready()
    if missing is not None:
        skip_or_fail(f"the local-model extra is missing: {missing}")
    logs = tmp_path_factory.mktemp("prompt-cache")
    with llama_server(logs) as base_url:
        yield base_url, logs / "llama-server.log"


async def test_the_second_turn_reuses_the_first_ones_prompt(server: tuple[str, Path]) -> None:
    from contextmode.api import build_engine
    from contextmode.engine import TurnRequest
    from contextmode.models.openai import OpenAIChatModel, OpenAIOptions
    from contextmode.settings import EngineSettings
    from contextmode.store.memory import MemoryStore
    from contextmode.types import SessionKey

    base_url, log = server
    model = OpenAIChatModel(model=LOCAL_MODEL_ALIAS, base_url=base_url, options=OpenAIOptions(
        reply_max_tokens=16, temperature=0.0))
    # Offline processors: no background call of the model runs between the two turns (on a
    # one-slot server it would replace the slot's cached prompt with its own).
    # The ``cache_first`` order (docs/caching.md): in the shipped order the system message holds
    # what changes between the turns (pins found in turn 1 among them), so less is kept.
    engine = build_engine(store=MemoryStore(), model=model, settings=EngineSettings(order="cache_first"))
    key = SessionKey("t", "cache")
    said = ["I keep three beehives on my roof in Lyon and they need flowers all summer.",
            "Which flowers should I plant for them in June?"]
    try:
        first = await engine.turn(TurnRequest(key=key, message=said[0]))
        seen = log.read_text(errors="replace")
        second = await engine.turn(TurnRequest(key=key, message=said[1]))
        await engine.drain()
        kind = model.server_info().kind
    finally:
        await engine.close()
        await model.aclose()
    first_prompt = int(_PROMPT.findall(seen)[-1])
    hits = [(int(kept), int(left)) for kept, left in _HIT.findall(log.read_text(errors="replace")[len(seen):])]
    print(f"\nprompt cache: time to first token turn 1 {first.ttft_ms:.0f} ms, turn 2 {second.ttft_ms:.0f} ms; "
          f"turn 1 evaluated {first_prompt} prompt tokens; turn 2 kept and evaluated {hits}")
    assert kind == "llamacpp"
    # The second request kept the whole first prompt (and the answer's tokens after it, which
    # the request repeats as the assistant turn): only the new message was evaluated.
    assert hits and hits[0][0] >= first_prompt, (hits, first_prompt)
    assert hits[0][1] < hits[0][0]
