"""Dense recall from an OpenAI-protocol embeddings server (`OpenAIEmbedder`), against the stub
server's ``POST /v1/embeddings``: unit rows, batches, the dimension learned from the first
answer, one-line errors, a paraphrase BM25 alone misses, and the settings that turn it on."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from contextmode.api import build_engine
from contextmode.errors import ConfigError, ModelUnavailable, OutputRejected
from contextmode.memory.recall import Recaller, RecallSettings
from contextmode.memory.recall.dense import DenseIndex, OpenAIEmbedder
from contextmode.settings import EngineSettings
from contextmode.store.memory import MemoryStore
from contextmode.testing.stub_server import EMBEDDING_DIM, StubServer, hashed_embedding
from contextmode.types import NewTurn, SessionKey, SessionState, Turn

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def stub() -> Iterator[StubServer]:
    server = StubServer()
    with server:
        yield server


def _embedding_requests(server: StubServer) -> list[list[str]]:
    return [r.body["input"] for r in server.requests if r.path.endswith("/embeddings")]


def test_rows_are_unit_float32_and_the_dimension_comes_from_the_first_answer(stub: StubServer) -> None:
    embedder = OpenAIEmbedder(stub.url, "stub-embed")
    vectors = embedder.embed(["the cat sat on the mat", "a dog", "the cat sat on the mat"])
    assert vectors.dtype == np.float32 and vectors.shape == (3, EMBEDDING_DIM)
    assert np.linalg.norm(vectors, axis=1) == pytest.approx([1.0, 1.0, 1.0], abs=1e-6)
    assert np.array_equal(vectors[0], vectors[2])  # the stub's raw vectors are counts, not unit
    assert embedder.dim == EMBEDDING_DIM
    assert len(_embedding_requests(stub)) == 1  # the dimension cost no extra request
    assert stub.requests[-1].body["model"] == "stub-embed"


def test_the_dimension_is_probed_once_when_asked_first(stub: StubServer) -> None:
    embedder = OpenAIEmbedder(stub.url, "stub-embed")
    assert embedder.dim == EMBEDDING_DIM and embedder.dim == EMBEDDING_DIM
    assert len(_embedding_requests(stub)) == 1


def test_texts_go_in_batches_in_order(stub: StubServer) -> None:
    texts = [f"text number {i} about {w}" for i, w in enumerate(["tea", "rain", "jazz", "chess", "snow"])]
    batched = OpenAIEmbedder(stub.url, "stub-embed", batch_size=2).embed(texts)
    assert [len(b) for b in _embedding_requests(stub)] == [2, 2, 1]
    assert [t for b in _embedding_requests(stub) for t in b] == texts
    one_by_one = np.vstack([OpenAIEmbedder(stub.url, "stub-embed").embed([t]) for t in texts])
    assert np.allclose(batched, one_by_one)


def test_the_key_goes_as_a_bearer_header_and_never_into_repr(stub: StubServer) -> None:
    embedder = OpenAIEmbedder(stub.url, "stub-embed", api_key="sk-secret-123")
    embedder.embed(["hello"])
    assert stub.requests[-1].headers["authorization"] == "Bearer sk-secret-123"
    assert "sk-secret" not in repr(embedder)
    settings = EngineSettings(embeddings_base_url=stub.url, embeddings_model="m", embeddings_api_key="sk-secret-123")
    assert "sk-secret" not in repr(settings)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_server_is_one_clear_line() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    with pytest.raises(ModelUnavailable, match=re.escape(f"could not reach the embeddings endpoint {url}/embeddings")) as info:
        OpenAIEmbedder(url, "m", timeout=2).embed(["hello"])
    assert "\n" not in str(info.value)


def test_a_failing_or_odd_server_is_one_clear_line(stub: StubServer) -> None:
    stub.fail_next(503, message="loading model")
    with pytest.raises(ModelUnavailable, match=r"answered 503: .*loading model"):
        OpenAIEmbedder(stub.url, "m").embed(["hello"])
    stub.embed = lambda text: []
    with pytest.raises(OutputRejected, match="without usable vectors") as info:
        OpenAIEmbedder(stub.url, "m").embed(["hello"])
    assert "\n" not in str(info.value)
    stub.embed = lambda text: [1.0] * (3 if "short" in text else 4)
    with pytest.raises(OutputRejected, match=r"\[3, 4\]"):
        OpenAIEmbedder(stub.url, "m").embed(["short", "long"])
    with pytest.raises(OutputRejected, match="expected 5"):
        OpenAIEmbedder(stub.url, "m", dim=5).embed(["long"])


def test_one_vector_per_token_is_mean_pooled(stub: StubServer) -> None:
    # llama-cpp-python's server answers so for a model without pooling (a chat model).
    stub.embed = lambda text: [[1.0, 0.0], [0.0, 1.0]] if "two" in text else [[3.0, 3.0]]  # type: ignore[assignment,return-value]
    embedder = OpenAIEmbedder(stub.url, "m")
    vectors = embedder.embed(["two tokens", "one"])
    assert vectors == pytest.approx(np.full((2, 2), 2 ** -0.5))
    # Its batches are wrong past the first input (tests/models/test_local_embeddings.py): one a request.
    assert _embedding_requests(stub) == [["two tokens", "one"], ["two tokens"], ["one"]]
    embedder.embed(["one", "two tokens"])
    assert _embedding_requests(stub)[3:] == [["one"], ["two tokens"]]
    four = OpenAIEmbedder(stub.url, "m", batch_size=2).embed(["two", "one", "one", "two"])
    assert four.shape == (4, 2) and np.array_equal(four[0], four[3])


def test_the_remote_model_is_refused_when_model_requests_are_off() -> None:
    # tests/conftest.py sets CONTEXTMODE_ALLOW_MODEL_REQUESTS=0: only loopback servers.
    with pytest.raises(ConfigError, match="disabled"):
        OpenAIEmbedder("https://api.openai.com/v1", "text-embedding-3-small")


def test_the_missing_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from contextmode.errors import MissingExtra

    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(MissingExtra, match=r"contextmode-engine\[openai\]"):
        OpenAIEmbedder("http://127.0.0.1:9/v1", "m")


class _FlakyEmbedder:
    def __init__(self) -> None:
        self.fail = True

    @property
    def dim(self) -> int:
        return EMBEDDING_DIM

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.fail:
            raise ModelUnavailable("down")
        return np.vstack([np.asarray(hashed_embedding(t), dtype=np.float32) + 1.0 for t in texts])


def test_turns_an_embedder_failed_on_are_embedded_at_the_next_call() -> None:
    embedder = _FlakyEmbedder()
    dense = DenseIndex(embedder)
    turns = [Turn(seq=i, role="user", content=f"turn {i} about tea", tokens=4, created_at=T0) for i in (1, 2)]
    with pytest.raises(ModelUnavailable):
        dense.add_many(turns)
    assert dense.last_seq == 0 and len(dense) == 0
    embedder.fail = False
    dense.add_many(turns)
    assert dense.last_seq == 2 and len(dense) == 2


# -- recall ------------------------------------------------------------------------------

_CALM = {"pottery", "therapy", "destress", "unwind", "relax"}


def _knows_calm(text: str) -> list[float]:
    """The stub as a model that knows these words mean alike (one shared direction)."""
    vector = hashed_embedding(text)
    vector[0] += 4.0 * sum(w in _CALM for w in re.findall(r"\w+", text.lower()))
    return vector


FILLER = [
    "We talked about the weather in Lisbon and the trams.",
    "My sister bought a new bicycle last week.",
    "The office printer broke again on Monday.",
    "I cooked a big pot of chili for the neighbours.",
    "Our team shipped the billing report before the deadline.",
    "The train to Porto was late by forty minutes.",
]


async def _session(store: MemoryStore) -> SessionState:
    contents = [*FILLER, "Pottery is like therapy for me.", *FILLER, *FILLER]
    await store.append(SessionKey("t", "s"), [
        NewTurn(role="user" if i % 2 == 0 else "assistant", content=c, tokens=len(c),
                created_at=T0 + timedelta(minutes=i))
        for i, c in enumerate(contents)
    ])
    return await store.load(SessionKey("t", "s"), recent=4)


async def test_recall_with_the_embedder_finds_a_paraphrase_bm25_misses(stub: StubServer) -> None:
    stub.embed = _knows_calm
    question = "Which activity lets me destress whenever everything feels overwhelming?"
    store = MemoryStore()
    state = await _session(store)
    bm25 = await Recaller(RecallSettings(neighbours=False)).recall(store, state, question, limit=3)
    assert all("Pottery" not in t.content for t in bm25)  # no word in common
    fused = Recaller(RecallSettings(neighbours=False), embedder=OpenAIEmbedder(stub.url, "stub-embed"))
    recalled = await fused.recall(store, state, question, limit=3)
    assert recalled[0].content == "Pottery is like therapy for me."
    # The session's turns went in one batch (within the default 64), then the question alone.
    assert [len(b) for b in _embedding_requests(stub)] == [state.last_seq, 1]


async def test_a_failing_embedder_leaves_recall_to_bm25_for_a_while(
    stub: StubServer, caplog: pytest.LogCaptureFixture
) -> None:
    stub.embed = _knows_calm
    question = "Which activity lets me destress whenever everything feels overwhelming?"
    store = MemoryStore()
    state = await _session(store)
    bm25 = await Recaller(RecallSettings(neighbours=False)).recall(store, state, question, limit=3)
    fused = Recaller(RecallSettings(neighbours=False), embedder=OpenAIEmbedder(stub.url, "stub-embed"))
    stub.fail_next(503, message="model loading")
    with caplog.at_level("WARNING", logger="contextmode.recall"):
        alone = await fused.recall(store, state, question, limit=3)
    assert [t.seq for t in alone] == [t.seq for t in bm25]  # the turn goes on, on BM25
    assert "BM25 alone for 30 s" in caplog.text and "answered 503: model loading" in caplog.text
    await fused.recall(store, state, question, limit=3)
    assert len(_embedding_requests(stub)) == 1  # paused: not asked again at once
    fused._dense_paused_until = 0.0  # the pause is over
    again = await fused.recall(store, state, question, limit=3)
    assert again[0].content == "Pottery is like therapy for me."
    assert [len(b) for b in _embedding_requests(stub)] == [state.last_seq, state.last_seq, 1]


# -- settings ----------------------------------------------------------------------------


def test_settings_read_the_env_and_are_off_by_default() -> None:
    assert not EngineSettings.from_env({}).embeddings
    settings = EngineSettings.from_env({
        "CONTEXTMODE_EMBEDDINGS_BASE_URL": "http://127.0.0.1:11434/v1",
        "CONTEXTMODE_EMBEDDINGS_MODEL": "nomic-embed-text",
        "CONTEXTMODE_EMBEDDINGS_API_KEY": "sk-1",
    })
    assert settings.embeddings and settings.embeddings_model == "nomic-embed-text"
    assert settings.embeddings_api_key == "sk-1"
    with pytest.raises(ConfigError, match="CONTEXTMODE_EMBEDDINGS_MODEL"):
        EngineSettings.from_env({"CONTEXTMODE_EMBEDDINGS_BASE_URL": "http://127.0.0.1:11434/v1",
                                 "CONTEXTMODE_EMBEDDING_MODEL": "nomic-embed-text"})


def test_build_engine_fuses_the_configured_embedder(stub: StubServer) -> None:
    plain = build_engine(store="memory://")
    assert isinstance(plain.recaller, Recaller) and plain.recaller.embedder is None
    settings = EngineSettings(embeddings_base_url=stub.url, embeddings_model="stub-embed")
    engine = build_engine(store="memory://", settings=settings)
    assert isinstance(engine.recaller, Recaller)
    embedder = engine.recaller.embedder
    assert isinstance(embedder, OpenAIEmbedder) and embedder.base_url == stub.url
    assert not engine.recaller.model_free  # the turn lets its store connection go first
    assert _embedding_requests(stub) == []  # nothing is asked before the first recall
