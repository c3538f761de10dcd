"""The small public API: `ContextMode`, sync and async, on embedded defaults.

```python
from contextmode import ContextMode

cm = ContextMode()                                  # SQLite under CONTEXTMODE_HOME, offline processors
cm.chat("demo", "我不吃辣，预算五十以内", user_id="u42")  # user_id: optional owner
reply = cm.chat("demo", "推荐一家餐厅吧")             # offline responder unless a model is configured
print(reply.answer)
ctx = cm.context("demo", "那家店在哪?")               # what the model would receive, per layer
print(ctx.summary_line())
cm.forget(user_id="u42")                            # erase the user everywhere (counts per kind)
```
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, Protocol, TypeGuard, TypeVar, runtime_checkable

from ._protocols import implements
from .assembly import Context
from .engine import (
    USE_DEFAULT,
    Engine,
    PreparedTurn,
    Processors,
    Recaller,
    TurnRequest,
    TurnResult,
    UseDefault,
)
from .errors import ConfigError
from .jobs import JobQueue
from .memory.recall.dense import Embedder
from .memory.strategies import Strategy
from .models.base import ChatModel
from .models.offline import OfflineResponder
from .models.server import ServerInfo
from .processors.window import ModelWindow
from .settings import EngineSettings, Mode
from .store.base import Store
from .store.lifecycle import DeletionRecord
from .tokens.base import TokenCounter
from .types import ChatMessage, SessionKey, Turn, utc_now

__all__ = ["ContextMode", "MessageRecord", "build_engine", "default_processors"]

log = logging.getLogger("contextmode.api")
T = TypeVar("T")

EXIT_DRAIN_S = 10.0
"""At interpreter exit, how long a `ContextMode` waits for its pending background jobs and
trace writes (each) before cancelling the rest: a summary or pin update cut short is
scheduled again by its session's next turn."""

_running: weakref.WeakSet[ContextMode] = weakref.WeakSet()
"""Instances whose loop thread runs (closed at interpreter exit, `_close_running`)."""
_exit_hook: list[bool] = []


def _close_running() -> None:
    """Close every `ContextMode` still running, finishing its pending work first. Called at
    interpreter exit *before* Python stops its worker threads: a job still running after that
    fails with "cannot schedule new futures after shutdown" (the store's calls need them)."""
    for memory in list(_running):
        try:
            memory._close(drain_timeout_s=EXIT_DRAIN_S)
        except Exception as exc:  # one instance's store failing must not keep the others open
            log.warning("could not close a ContextMode at exit: %s", exc)


def _close_at_exit(memory: ContextMode) -> None:
    _running.add(memory)
    if not _exit_hook:
        _exit_hook.append(True)
        # `threading` runs these hooks before it shuts the thread pools down (`atexit`'s run after).
        register = getattr(threading, "_register_atexit", atexit.register)
        with contextlib.suppress(RuntimeError):  # the interpreter is exiting already
            register(_close_running)


DEFAULT_COUNTING_MODEL = "gpt-4o"
"""Whose tokenizer counts tokens when no model is configured (o200k_base)."""
ProcessorKind = Literal["offline", "llm"]


def default_processors(
    model: ChatModel, kind: ProcessorKind | None = None, *, window: ModelWindow | None = None
) -> Processors:
    """The processors `build_engine` uses: ``offline``, or ``llm`` ones calling ``model``
    (``kind`` default: ``CONTEXTMODE_PROCESSORS``, else ``offline``). ``window``: the model's
    context window and counter; the ``llm`` processors cut the user's text so every call fits it
    (`build_engine` passes the engine's)."""
    if kind is None:
        kind = os.environ.get("CONTEXTMODE_PROCESSORS", "offline")  # type: ignore[assignment]
    offline = Processors.offline()
    if kind == "offline":
        return offline
    if kind != "llm":
        raise ConfigError(f"CONTEXTMODE_PROCESSORS must be 'offline' or 'llm', got {kind!r}")
    from .processors.audit import AuditedSummarizer
    from .processors.llm import (
        LLMConstraintExtractor,
        LLMContextDetector,
        LLMEmotionScorer,
        LLMLimits,
        LLMRewriter,
        LLMSummarizer,
    )

    # On the response path a model failure falls back to the offline processor; in
    # background jobs it raises, so the job is retried and, at worst, recorded as failed
    # (or as rejected, without retries, when the model's output was unusable).
    limits = LLMLimits.from_env()
    # The summary's calls are fitted to the window by the engine, which folds the due turns in
    # chunks (`engine.schedule.summarize_now`); the others cut the user's text to fit.
    return Processors(
        detector=LLMContextDetector(model, fallback=offline.detector, max_tokens=limits.detect, window=window),
        rewriter=LLMRewriter(model, fallback=offline.rewriter, max_tokens=limits.rewrite, window=window),
        summarizer=AuditedSummarizer(LLMSummarizer(model, max_tokens=limits.summary)),
        extractor=LLMConstraintExtractor(model, max_tokens=limits.constraints, window=window),
        emotion=LLMEmotionScorer(model, max_tokens=limits.emotion, window=window),
    )


@runtime_checkable
class ServerDescribed(Protocol):
    """A model whose server can say its context window and tokenizer (`OpenAIChatModel`)."""

    def server_info(self) -> ServerInfo: ...


def describes_server(model: object) -> TypeGuard[ServerDescribed]:
    """True when ``model`` can probe its server (see `models.server.probe_server`)."""
    return implements(model, ServerDescribed)


@runtime_checkable
class CapsReplies(Protocol):
    """A model whose replies have a ``max_tokens`` cap (`OpenAIChatModel`: 1024 by default)."""

    reply_max_tokens: int | None


def caps_replies(model: object) -> TypeGuard[CapsReplies]:
    """True when ``model`` says how long its replies may get."""
    return implements(model, CapsReplies)


def _reserve_the_reply(settings: EngineSettings, model: ChatModel) -> EngineSettings:
    """Settings whose default reply reserve (a quarter of the window) is at least the model's
    reply cap, so the context plus the longest reply fits the window. A reserve set in the
    configuration stands (integrations use ``reply_reserve=0`` for an input-only budget)."""
    cap = model.reply_max_tokens if caps_replies(model) else None
    window = settings.context_window
    if settings.reply_reserve is not None or not cap or cap <= window // 4:
        return settings
    if cap >= window:
        raise ConfigError(
            f"the reply cap is {cap} tokens (CONTEXTMODE_LLM_REPLY_MAX_TOKENS) but the context window is "
            f"{window} tokens: set CONTEXTMODE_LLM_REPLY_MAX_TOKENS below {window}"
        )
    log.info("reply reserve: %d tokens, the model's reply cap (a quarter of the window is less)", cap)
    return replace(settings, reply_reserve=cap)


def _fit_server(
    settings: EngineSettings, model: ChatModel, counter: TokenCounter | None, *, window_set: bool
) -> tuple[EngineSettings, TokenCounter | None]:
    """Take the context window, and a tokenizer for a model without a local one, from the model's
    server when it says (see `models.server.probe_server`).

    A window set in the configuration that is larger than the server's is a `ConfigError`
    naming both numbers; an unset one becomes the server's.
    """
    info = model.server_info() if describes_server(model) else None
    if info is None:
        return settings, counter
    window = info.context_window
    if window is not None:
        if window_set and settings.context_window > window:
            raise ConfigError(
                f"the context budget is {settings.context_window} tokens (CONTEXTMODE_CONTEXT_WINDOW) but the "
                f"model server's window is {window} tokens ({info.window_source}); "
                f"set CONTEXTMODE_CONTEXT_WINDOW to {window} or less"
            )
        if not window_set:
            settings = replace(settings, context_window=window)
            log.info("context window: %d tokens, from the model server (%s)", window, info.window_source)
    if counter is None and info.tokenize_url and not os.environ.get("CONTEXTMODE_TOKENIZER", "").strip():
        from .models.server import ServerTokenCounter
        from .tokens import counter_for_encoding, encoding_for_model

        encoding = encoding_for_model(model.name)
        if encoding.startswith("estimate:"):
            counter = ServerTokenCounter(info.tokenize_url, model=model.name,
                                         fallback=counter_for_encoding(encoding))
            log.info("token counter: the model server's own tokenizer (%s, exact)", info.tokenize_url)
    return settings, counter


def build_engine(
    *,
    store: Store | str | None = None,
    model: ChatModel | None = None,
    counter: TokenCounter | None = None,
    settings: EngineSettings | None = None,
    processors: ProcessorKind | Processors | Callable[[ChatModel], Processors] | None = None,
    recaller: Recaller | UseDefault | None = USE_DEFAULT,
    jobs: JobQueue | None = None,
    system_prompt: str | None = None,
) -> Engine:
    """An `Engine` on the configured or embedded defaults.

    ``store``: a `Store` or a URL (``sqlite:///…``, ``postgresql://…``, ``redis://…``,
    ``memory://``); default ``CONTEXTMODE_STORE_URL`` or SQLite under ``CONTEXTMODE_HOME``.
    ``model``: default from ``CONTEXTMODE_LLM_*`` or the offline responder (one made here is closed
    by ``Engine.close``; one passed in stays the caller's).
    ``processors``: ``offline`` (default) or ``llm`` (``CONTEXTMODE_PROCESSORS``), a
    `Processors` value (e.g. ``replace(Processors.offline(), summarizer=mine)``), or a function
    of the chosen model (e.g. ``lambda m: replace(default_processors(m), summarizer=mine)``).
    ``recaller``: default the BM25 `Recaller` (``None``: no recall layer), fused with dense
    retrieval from ``settings.embeddings_base_url`` when one is set (``CONTEXTMODE_EMBEDDINGS_*``).
    """
    from .models.factory import model_from_env
    from .store import open_store
    from .tokens import counter_for_model

    # A window chosen by the caller (env, or settings off the default) is checked against the
    # server's; a default one is replaced by the server's.
    window_set = bool(os.environ.get("CONTEXTMODE_CONTEXT_WINDOW", "").strip()) or (
        settings is not None and settings.context_window != EngineSettings().context_window)
    settings = settings or EngineSettings.from_env()
    named = os.environ.get("CONTEXTMODE_LLM_MODEL") or (model.name if model is not None else None)
    owns_model = model is None
    if model is None:
        model = model_from_env()
    settings, counter = _fit_server(settings, model, counter, window_set=window_set)
    settings = _reserve_the_reply(settings, model)
    if counter is None:
        # The configured model's tokenizer; with none configured, o200k (gpt-4o family).
        counter = counter_for_model(named or DEFAULT_COUNTING_MODEL)
        log.info("token counter: %s (%s)", counter.name, "exact" if counter.exact else "an estimate")
    if isinstance(model, OfflineResponder) and model.counter is None:
        # Its notices show token totals: a new responder with the engine's counter.
        model = OfflineResponder(counter=counter, preview_chars=model.preview_chars, max_listed=model.max_listed,
                                 chunk_chars=model.chunk_chars, name=model.name)
    if store is None or isinstance(store, str):
        store = open_store(store)
    if callable(processors):
        processors = processors(model)
    elif not isinstance(processors, Processors):
        processors = default_processors(
            model, processors, window=ModelWindow(tokens=settings.context_window, counter=counter))
    if isinstance(recaller, UseDefault):
        # Recall costs O(new turn) per turn to index; it is used by strategies with a recall layer.
        from .memory.recall import Recaller as BM25Recaller

        recaller = BM25Recaller(embedder=_embedder(settings))
    engine = Engine(store=store, model=model, counter=counter, processors=processors, settings=settings,
                    recaller=recaller, jobs=jobs, system_prompt=system_prompt)
    engine.owns_model = owns_model  # its HTTP client is closed with the engine
    return engine


def _embedder(settings: EngineSettings) -> Embedder | None:
    """The dense-recall embedder the settings name (an OpenAI-protocol server), or ``None``."""
    if not (settings.embeddings_base_url and settings.embeddings_model):
        return None
    from .memory.recall.dense import OpenAIEmbedder

    log.info("recall: BM25 fused with embeddings from %s (%s)", settings.embeddings_base_url, settings.embeddings_model)
    return OpenAIEmbedder(settings.embeddings_base_url, settings.embeddings_model,
                          api_key=settings.embeddings_api_key)


class ContextMode:
    """Memory for a chat application, sync or async.

    The async methods (``achat``, ``astream``, ``acontext``) run on the caller's
    loop; the sync ones (``chat``, ``context``) run on a private event-loop
    thread so connections stay open between calls. Don't mix both kinds on one
    instance.
    """

    def __init__(
        self,
        *,
        tenant: str | None = None,
        mode: Mode | None = None,
        engine: Engine | None = None,
        store: Store | str | None = None,
        model: ChatModel | None = None,
        counter: TokenCounter | None = None,
        settings: EngineSettings | None = None,
        processors: ProcessorKind | Processors | None = None,
    ) -> None:
        """``engine``, or one `build_engine` makes from ``store``, ``model``, ``counter``,
        ``settings`` and ``processors``; ``tenant`` and ``mode`` apply to every call."""
        self.engine = engine or build_engine(
            store=store, model=model, counter=counter, settings=settings, processors=processors
        )
        self.tenant = tenant or self.engine.settings.tenant
        self.mode = mode
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _key(self, session_id: str) -> SessionKey:
        """The session's key in this instance's tenant: a method's ``session_id`` checked once."""
        return SessionKey(self.tenant, session_id)

    def _request(
        self, session_id: str, message: str, *, mode: Mode | None, strategy: str | Strategy | None,
        system_prompt: str | UseDefault | None, metadata: Mapping[str, Any] | None = None,
        user_id: str | None = None, now: datetime | None = None,
    ) -> TurnRequest:
        """The turn's request, checked here once (ids, message, user id)."""
        return TurnRequest(
            key=self._key(session_id), message=message, mode=mode or self.mode, strategy=strategy,
            system_prompt=system_prompt, metadata=metadata or {}, user_id=user_id, now=now,
        )

    # -- async -----------------------------------------------------------

    async def achat(
        self, session_id: str, message: str, *, mode: Mode | None = None, strategy: str | Strategy | None = None,
        system_prompt: str | UseDefault | None = USE_DEFAULT, metadata: Mapping[str, Any] | None = None,
        user_id: str | None = None,
    ) -> TurnResult:
        """Run one turn and return the answer with its context and accounting."""
        request = self._request(session_id, message, mode=mode, strategy=strategy, system_prompt=system_prompt,
                                metadata=metadata, user_id=user_id)
        return await self.engine.turn(request)

    async def astream(
        self, session_id: str, message: str, *, mode: Mode | None = None, strategy: str | Strategy | None = None,
        system_prompt: str | UseDefault | None = USE_DEFAULT, metadata: Mapping[str, Any] | None = None,
        user_id: str | None = None,
    ) -> AsyncIterator[str]:
        """Run one turn, yielding the answer's text as it streams (a model failure is raised
        after the partial answer is stored)."""
        request = self._request(session_id, message, mode=mode, strategy=strategy, system_prompt=system_prompt,
                                metadata=metadata, user_id=user_id)
        async for event in self.engine.stream(request):
            if event.kind == "delta":
                yield event.text
            elif event.kind == "failed":
                raise event.error

    async def aprepare(
        self, session_id: str, message: str, *, mode: Mode | None = None, strategy: str | Strategy | None = None,
        system_prompt: str | UseDefault | None = USE_DEFAULT, now: datetime | None = None,
    ) -> PreparedTurn:
        """What the next turn would do (detection, rewrite, context), writing nothing."""
        request = self._request(session_id, message, mode=mode, strategy=strategy, system_prompt=system_prompt,
                                now=now)
        return await self.engine.prepare(request)

    async def acontext(
        self, session_id: str, message: str, *, mode: Mode | None = None, strategy: str | Strategy | None = None,
        system_prompt: str | UseDefault | None = USE_DEFAULT, now: datetime | None = None,
    ) -> Context:
        """Exactly what the model would receive for ``message``, per layer with tokens."""
        prepared = await self.aprepare(session_id, message, mode=mode, strategy=strategy,
                                       system_prompt=system_prompt, now=now)
        return prepared.context

    async def arecord(
        self, session_id: str, role: Literal["user", "assistant"], content: str,
        *, metadata: dict[str, Any] | None = None, user_id: str | None = None,
    ) -> Turn:
        """Store one turn the application already has (its own model answered, an import)
        without calling the model; summaries, pins and recall see it like a live turn."""
        return await self.engine.record(self.tenant, session_id, role, content,
                                        metadata=metadata, user_id=user_id)

    async def aturns(self, session_id: str) -> list[Turn]:
        """Every stored turn of the session, oldest first (empty for an unknown session)."""
        return await self.engine.store.turns(self._key(session_id))

    async def aforget(
        self, *, user_id: str | None = None, session_id: str | None = None, tenant: bool = False
    ) -> DeletionRecord:
        """Erase one user (all their sessions), one session, or (``tenant=True``) this whole
        tenant, with every derived record; returns the deletion record with counts per kind."""
        from .lifecycle.forget import forget

        named = [(scope, value) for scope, value in (("user", user_id), ("session", session_id)) if value]
        if len(named) + tenant != 1:
            raise ConfigError("forget exactly one of: user_id=..., session_id=..., tenant=True")
        scope, target = named[0] if named else ("tenant", self.tenant)
        return await forget(self.engine.store, self.tenant, scope, target,  # type: ignore[arg-type]
                            actor="library", caches=[self.engine])

    async def aclose(self) -> None:
        await self.engine.close()

    # -- sync ------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="contextmode-loop", daemon=True)
            self._thread.start()
            _close_at_exit(self)
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def chat(
        self, session_id: str, message: str, *, mode: Mode | None = None, strategy: str | Strategy | None = None,
        system_prompt: str | UseDefault | None = USE_DEFAULT, metadata: Mapping[str, Any] | None = None,
        user_id: str | None = None,
    ) -> TurnResult:
        """Sync `achat`."""
        return self._run(self.achat(session_id, message, mode=mode, strategy=strategy, system_prompt=system_prompt,
                                    metadata=metadata, user_id=user_id))

    def stream(
        self, session_id: str, message: str, *, mode: Mode | None = None, strategy: str | Strategy | None = None,
        system_prompt: str | UseDefault | None = USE_DEFAULT, metadata: Mapping[str, Any] | None = None,
        user_id: str | None = None,
    ) -> Iterator[str]:
        """Sync `astream`: the answer's text as it streams. Leaving the loop early stores
        the partial answer, as a client going away does."""
        pieces = self.astream(session_id, message, mode=mode, strategy=strategy, system_prompt=system_prompt,
                              metadata=metadata, user_id=user_id)

        async def following() -> str | None:
            return await anext(pieces, None)

        try:
            while (piece := self._run(following())) is not None:
                yield piece
        finally:
            self._run(pieces.aclose())  # type: ignore[attr-defined]

    def prepare(
        self, session_id: str, message: str, *, mode: Mode | None = None, strategy: str | Strategy | None = None,
        system_prompt: str | UseDefault | None = USE_DEFAULT, now: datetime | None = None,
    ) -> PreparedTurn:
        """Sync `aprepare`."""
        return self._run(self.aprepare(session_id, message, mode=mode, strategy=strategy,
                                       system_prompt=system_prompt, now=now))

    def context(
        self, session_id: str, message: str, *, mode: Mode | None = None, strategy: str | Strategy | None = None,
        system_prompt: str | UseDefault | None = USE_DEFAULT, now: datetime | None = None,
    ) -> Context:
        """Sync `acontext`."""
        return self._run(self.acontext(session_id, message, mode=mode, strategy=strategy,
                                       system_prompt=system_prompt, now=now))

    def record(
        self, session_id: str, role: Literal["user", "assistant"], content: str,
        *, metadata: dict[str, Any] | None = None, user_id: str | None = None,
    ) -> Turn:
        """Sync `arecord`."""
        return self._run(self.arecord(session_id, role, content, metadata=metadata, user_id=user_id))

    def turns(self, session_id: str) -> list[Turn]:
        """Sync `aturns`."""
        return self._run(self.aturns(session_id))

    def forget(
        self, *, user_id: str | None = None, session_id: str | None = None, tenant: bool = False
    ) -> DeletionRecord:
        """Sync `aforget`."""
        return self._run(self.aforget(user_id=user_id, session_id=session_id, tenant=tenant))

    def drain(self) -> None:
        """Wait for the background jobs (summaries, constraints, emotions) to finish."""
        self._run(self.engine.drain())

    def close(self) -> None:
        """Finish background jobs and close the store. An instance still open when the
        interpreter exits is closed then (its jobs get `EXIT_DRAIN_S` seconds)."""
        self._close(drain_timeout_s=30.0)

    def _close(self, *, drain_timeout_s: float) -> None:
        _running.discard(self)
        if self._loop is not None:
            self._run(self.engine.close(drain_timeout_s=drain_timeout_s))
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._loop.close()
            self._loop = None

    def __enter__(self) -> ContextMode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- integrations (issue 20: agent-framework adapters) -----------------
    # A delimited block so the lead can merge it beside the engine/api refactor:
    # what `contextmode.integrations` needs beyond chat/record/context.

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on this instance's private loop thread (the one the sync methods use)
        and return its future: callers on any thread or loop (``Runner.run_sync``) share one
        loop, so the store's connections are never used from two loops."""
        if self._loop is None:
            self._run(asyncio.sleep(0))  # starts the loop thread
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def arecord_messages(
        self, session_id: str, records: Sequence[MessageRecord], *, user_id: str | None = None
    ) -> list[Turn]:
        """Store several messages at once, atomically and in order, without calling the model:
        agent items included (an assistant message's ``tool_calls``, ``tool`` results with
        their ``tool_call_id``), each counted like a live one (`count_turn`). The user
        messages schedule the jobs a live turn schedules (summary, pins, emotions)."""
        from .engine.persist import exchanges_so_far, observe
        from .engine.schedule import schedule_jobs
        from .tokens.tools import count_turn
        from .types import NewTurn

        engine = self.engine
        parts = engine.parts()
        key = self._key(session_id)
        if not records:
            return []
        exchanges = await exchanges_so_far(parts, key, None)
        new: list[NewTurn] = []
        for record in records:
            m = record.message
            meta = dict(record.metadata)
            exchanges += m.role == "user"
            meta["turn"] = exchanges
            tokens = count_turn(engine.counter, m.content, tool_calls=m.tool_calls, tool_result=m.role == "tool")
            new.append(NewTurn(role=m.role, content=m.content, tokens=tokens, metadata=meta,
                               tool_calls=m.tool_calls, tool_call_id=m.tool_call_id,
                               created_at=record.created_at or utc_now()))
        stored = await engine.store.append(key, engine.keepable(self.tenant, new), user_id=user_id)
        observe(parts, key, stored)
        for turn in stored:
            if turn.role == "user":
                schedule_jobs(parts, key, turn, None)
        return stored

    async def apop(self, session_id: str) -> Turn | None:
        """Remove the session's newest turn and return it (``None`` for an empty session).

        The log is append-only, so this rewrites the session: it is erased like `aforget`
        (a deletion record says so) and its other turns are stored again unchanged (same
        numbers, times, metadata and emotion scores), with the summary and the pins that
        did not come from the removed turn. O(session); meant for undo and retries."""
        key = self._key(session_id)
        engine = self.engine
        turns = await engine.store.turns(key)
        if not turns:
            return None
        state = await engine.store.load(key, recent=0, max_uncovered=0)
        info = await self._session_user(key)
        popped, kept = turns[-1], turns[:-1]
        await self.aforget(session_id=session_id)
        if not kept:
            return popped
        from .types import NewTurn

        stored = await engine.store.append(key, [
            NewTurn(role=t.role, content=t.content, tokens=t.tokens, created_at=t.created_at,
                    emotion=t.emotion, metadata=t.metadata, tool_calls=t.tool_calls, tool_call_id=t.tool_call_id,
                    tool_name=t.tool_name) for t in kept], user_id=info)
        from .engine.persist import observe

        observe(engine.parts(), key, stored)
        if state.summary is not None and state.summary.covers_seq < popped.seq:
            await engine.store.commit_summary(key, state.summary, expected_version=0)
        pins = [c for c in state.constraints if c.source_seq != popped.seq]
        if pins:
            await engine.store.commit_constraints(key, pins, expected_version=0)
        return popped

    async def _session_user(self, key: SessionKey) -> str | None:
        info = await self.engine.store.info(key)
        return info.user_id if info is not None else None

    async def aturns_between(self, session_id: str, from_seq: int, to_seq: int | None = None) -> list[Turn]:
        """The session's turns ``from_seq..to_seq`` (inclusive; ``None``: to the newest), oldest first."""
        return await self.engine.store.turns(self._key(session_id), from_seq=from_seq, to_seq=to_seq)

    async def anewest(self, session_id: str) -> Turn | None:
        """The session's newest stored turn (``None`` for an empty session), in O(1)."""
        key = self._key(session_id)
        last = (await self.engine.store.version(key)).last_seq
        tail = await self.engine.store.turns(key, from_seq=last, to_seq=last) if last else []
        return tail[-1] if tail else None

    async def acontinue(self, session_id: str, *, system_prompt: str | UseDefault | None = USE_DEFAULT) -> Context:
        """What the model would receive to continue the session as stored (no new message):
        the latest user turn and everything after it (calls, results, the answer) whole,
        the earlier turns through the layers (summary, pins, and recall for that user turn).
        ``system_prompt`` as for `acontext`. Raises `MessageTooLarge` when that user turn and
        its step alone exceed the budget, `InputError` when the session holds no user turn."""
        from .assembly import CurrentTurn, assemble
        from .engine.agent import latest_user
        from .memory.strategies import get_strategy

        engine = self.engine
        chosen = get_strategy(engine.settings.strategy)
        key = self._key(session_id)
        state = await engine.load(key.tenant, key.session_id, chosen)
        history, user, step = await latest_user(engine.parts(), key, state)
        state = replace(state, turns=tuple(history))
        recall_limit = int(getattr(chosen, "recall_limit", 0) or 0)
        if engine.recaller is not None and recall_limit:
            recalled = await engine.recaller.recall(
                engine.store, state, user.content, limit=recall_limit, recent_turns=chosen.recent_turns)
            state = replace(state, recalled=tuple(t for t in recalled if t.seq < user.seq and not t.notice))
        return assemble(state, user.content, counter=engine.counter, strategy=chosen, budget=engine.budget(),
                        config=engine.assembly_config(system_prompt), current=CurrentTurn(agent_step=step))

    # -- end of the integrations block ------------------------------------


@dataclass(frozen=True, kw_only=True)
class MessageRecord:
    """One message to store with `ContextMode.arecord_messages` (integrations block)."""

    message: ChatMessage
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Free JSON-able extras kept with the turn (an adapter's original item, a speaker…)."""
    created_at: datetime | None = None
    """When it was said (default: now)."""
