"""Recall: bring back the old turns that matter to the current message.

The recent window shows the newest turns and the summary compresses the rest;
neither helps when the user asks about something said two hundred turns ago.
The `Recaller` ranks the session's older turns against the message with an
incremental BM25 index (`index.BM25Index`) and returns them best first
for the ``recall`` layer, each optionally followed by the turn before it (the
question a hit answers is often what makes it understandable), and a hit that
asks something by the turn after it (its answer, `with_answers`).

Query: the message's terms at full weight; when the message is short and leans
on the conversation ("那个按钮在哪?"), terms of the last turns are added at a
lower weight (query expansion), so the index can still find the topic.

Where the index lives: a store that keeps it (`store.postings`: SQLite, PostgreSQL
and Redis write each turn's postings with the append) is queried
directly — only the query terms' postings are read, never the turns
(`stored`). Otherwise (memory store, or a session not yet caught up
by ``contextmode index``) indexes live in this process, one per session, in an
LRU of ``max_sessions``: the first use rebuilds a session's index from the store
(one pass over its turns, ~20 µs a turn), later uses add only the turns that
arrived since.

After the turns are read, a message that names some of the session's speakers
(``metadata["speaker"]``) lifts what those speakers said (`focus_on_speakers`).

Each recalled turn carries ``metadata["recall"]`` (its score, and the hit a
neighbour belongs to); `explain_recall` adds the matched query terms for the
inspector.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from functools import partial
from typing import Literal, Protocol

from ...errors import ModelError
from ...processors.base import ModelFree
from ...store.postings import (
    IndexStats,
    PostingsStore,
    has_postings,
    one_connection,
    reads_turns_at,
)
from ...text.index_terms import analyze, indexed, turn_text
from ...text.lang import is_chinese
from ...types import SessionKey, SessionState, Turn
from .dense import DenseIndex, Embedder, convex_fuse, english_only, rrf_fuse
from .index import BM25Index, QueryMemo, RecallIndex
from .semantic import Thesaurus, default_thesaurus, expand
from .stored import StoredPostings
from .strategy import HybridRecall

log = logging.getLogger("contextmode.recall")

DENSE_PAUSE_S = 30.0
"""After the embedder fails, recall ranks by BM25 alone for this many seconds before it asks again."""

_THREAD_BATCH = 256
"""Catch-ups of at least this many turns run in a worker thread."""

__all__ = [
    "HybridRecall",
    "RecallHit",
    "RecallReason",
    "RecallSettings",
    "Recaller",
    "TurnSource",
    "explain_recall",
    "fetch_turns",
    "focus_on_speakers",
    "named_speakers",
    "query_reads",
    "recall_query",
    "semantic_cap",
    "with_answers",
]


class TurnSource(Protocol):
    """What recall needs of a store: bounded reads of the turn log."""

    async def turns(
        self, key: SessionKey, *, from_seq: int = 1, to_seq: int | None = None
    ) -> list[Turn]: ...


@dataclass(frozen=True, kw_only=True)
class RecallSettings:
    """How recall ranks and expands (defaults chosen on principle, see docs/quality.md)."""

    candidates: int = 64
    """Index hits considered per message (before neighbours); the layer's budget decides how many fit.
    With their neighbours, 64 hits fill the engine's `HybridRecall.recall_limit` (128 turns)."""
    neighbours: bool = True
    """Follow each hit with the turn just before it."""
    neighbour_weight: float = 0.5
    """A neighbour ranks as its hit's score times this (it matters less than the hit)."""
    following_weight: float = 0.0
    """Also follow each hit with the turn just after it (the reply to a hit), ranked at its
    score times this (0 = off)."""
    answers: bool = True
    """Follow a hit that asks something (a "?" in it) with the turn after it, its answer,
    ranked like the turn before a hit (``neighbour_weight`` × the hit's score): the
    question a hit answers comes in before it, the answer a hit asks for after it."""
    expansion_turns: int = 2
    """How many of the newest turns lend their terms to a short message."""
    expansion_weight: float = 0.3
    """Weight of a borrowed term relative to the message's own terms."""
    short_message_terms: int = 3
    """A message with fewer content terms than this borrows terms from the newest turns."""
    feedback_turns: int = 3
    """Pseudo-relevance feedback: the best this many hits lend their terms to a second
    BM25 pass (0 = off). Finds the other turns on the same topic a question spans."""
    feedback_terms: int = 10
    """How many feedback terms (highest idf summed over the feedback turns) are added."""
    feedback_weight: float = 0.3
    """Weight of a feedback term relative to the message's own terms."""
    speaker_focus: float = 2.0
    """When the message names some, not all, of the speakers among the candidates
    (``metadata["speaker"]``: "What does Melanie do to destress?"), their turns' scores are
    multiplied by this; 1 = off. See `focus_on_speakers` and ``focus_neighbours``."""
    focus_neighbours: bool = False
    """Under speaker focus, a neighbour shares its hit's lift whoever said it (True); by default
    (False) every turn, hit or neighbour, is lifted only when a named speaker said it — the
    turn before a named speaker's hit is usually the other speaker's, and lifting it spent the
    budget on turns that are not about the person asked about."""
    semantic_neighbours: int = 5
    """Semantic query expansion (`semantic.expand`): each English content term of the message
    also asks for up to this many of its nearest terms by meaning in the shipped thesaurus
    (distilled from all-MiniLM-L6-v2; "martial" → "karate", "taekwondo"); 0 = off."""
    semantic_floor: float = 0.6
    """Only neighbours at least this similar (cosine of the words' MiniLM embeddings) are added."""
    semantic_weight: float = 0.4
    """A neighbour's weight is this × its similarity (the message's own terms weigh 1)."""
    semantic_max_terms: int = 12
    """At most this many neighbour terms per message, the heaviest (a cost guard)."""
    semantic_max_share: float = 0.05
    """A neighbour found in more than this share of the session's turns is not added: its
    idf makes it worth little, and scoring it reads long postings (a cost guard)."""
    semantic_max_df: int = 1000
    """Nor one found in more than this many turns (bounds what a cold worker reads for a
    neighbour in a long session; below 20,000 turns the share above decides)."""
    fusion: Literal["convex", "rrf"] = "convex"
    """How BM25 and dense rankings are fused when an embedder is given: a convex combination
    of the scaled scores (`dense.convex_fuse`), or reciprocal rank fusion (`dense.rrf_fuse`)."""
    dense_weight: float = 0.2
    """Weight of the scaled cosine in the convex fusion (BM25 gets 1 − this). 0.2–0.35 score
    alike on LoCoMo dev whichever half of the conversations chooses; 0.2 is the one that loses
    no question category at any budget (docs/quality.md)."""
    rrf_k: float = 60.0
    """Reciprocal-rank-fusion constant when ``fusion="rrf"`` (60, as in Cormack et al.)."""
    batch: int = 2000
    """Turns read from the store per call when (re)building an index."""


@dataclass(frozen=True, kw_only=True)
class RecallHit:
    """One recalled turn and why."""

    seq: int
    score: float
    """BM25 score, or the fused score when dense retrieval is fused in
    (neighbours: their hit's score × ``neighbour_weight``)."""
    neighbour_of: int | None = None
    """For a turn brought in as context of a hit: that hit's seq."""


def semantic_cap(settings: RecallSettings, docs: int) -> float:
    """The most turns a neighbour by meaning may be found in to join a query (of ``docs``)."""
    return min(settings.semantic_max_share * docs, settings.semantic_max_df)


def recall_query(
    message: str, recent: Sequence[Turn], settings: RecallSettings,
    thesaurus: Thesaurus | None = None, *, counts: TermCounts | None = None,
) -> dict[str, float]:
    """The weighted query terms for ``message`` (term → weight): its own terms, their
    nearest terms by meaning (``thesaurus``, default the shipped one; see
    ``RecallSettings.semantic_neighbours``; with ``counts``, the index's document
    frequencies, none found in more than ``semantic_max_share`` of the turns) and, for a
    short message, the newest turns' terms."""
    own = Counter(analyze(message))
    weights: dict[str, float] = {term: float(n) for term, n in own.items()}
    if settings.semantic_neighbours > 0:
        keep = None
        if counts is not None:
            most = semantic_cap(settings, counts.docs)

            def keep(term: str) -> bool:
                return counts.df(term) <= most

        weights = _expand(message, weights, settings, thesaurus, keep=keep, most=settings.semantic_max_terms)
    return _with_recent(weights, own, recent, settings)


def _with_recent(
    weights: dict[str, float], own: Counter[str], recent: Sequence[Turn], settings: RecallSettings
) -> dict[str, float]:
    """``weights`` plus, for a short message (``own``: its terms), the newest turns' terms."""
    if len(own) >= settings.short_message_terms or not recent:
        return weights
    for turn in recent[-settings.expansion_turns :]:
        for term in analyze(turn.content):
            if term not in own:
                weights[term] = max(weights.get(term, 0.0), settings.expansion_weight)
    return weights


def query_reads(
    message: str, recent: Sequence[Turn], settings: RecallSettings, thesaurus: Thesaurus | None = None
) -> tuple[list[str], list[str]]:
    """What `recall_query` may ask of an index, known before any document frequency: the
    terms it always asks (the message's own; for a short message, the newest turns') and
    every neighbour by meaning it may add before the frequency guard and the
    ``semantic_max_terms`` cut, heaviest first (a store reads them with the guard in one call)."""
    own = Counter(analyze(message))
    weights = {term: float(n) for term, n in own.items()}
    always = list(_with_recent(dict(weights), own, recent, settings))
    if settings.semantic_neighbours <= 0:
        return always, []
    near = _expand(message, weights, settings, thesaurus)
    added = [t for t in near if t not in weights]
    return always, sorted(added, key=lambda t: (-near[t], t))  # heaviest first, as `expand` keeps them


def _expand(
    message: str, weights: dict[str, float], settings: RecallSettings, thesaurus: Thesaurus | None,
    *, keep: Callable[[str], bool] | None = None, most: int | None = None,
) -> dict[str, float]:
    """`semantic.expand` with ``settings``' neighbours, floor and weight (``thesaurus``:
    default the shipped one)."""
    return expand(
        message, weights, thesaurus or default_thesaurus(), neighbours=settings.semantic_neighbours,
        floor=settings.semantic_floor, weight=settings.semantic_weight, keep=keep, most=most,
    )


class TermCounts(Protocol):
    """Document frequencies of an index (`BM25Index`, `StoredIndex` once ``load_df`` ran)."""

    @property
    def docs(self) -> int: ...

    def df(self, term: str) -> int: ...


@dataclass
class _Entry:
    index: BM25Index
    dense: DenseIndex | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    created_at: datetime | None = None
    """When the indexed session was created: a session deleted and re-created under the
    same id (by any worker) has another, and its index is rebuilt."""


class Recaller(ModelFree):
    """Ranks a session's older turns against the current message (see the module docstring)."""

    def __init__(
        self,
        settings: RecallSettings | None = None,
        *,
        index_factory: Callable[[], BM25Index] = BM25Index,
        embedder: Embedder | None = None,
        max_sessions: int = 256,
    ) -> None:
        self.settings = settings or RecallSettings()
        self.embedder = embedder
        """With an embedder, dense retrieval runs beside BM25 and the two are fused
        (``settings.fusion``: a convex combination of the scaled scores by default)."""
        self._index_factory = index_factory
        self._max_sessions = max_sessions
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._stored = StoredPostings()
        self._dense_paused_until = 0.0
        """`time.monotonic` before which the embedder is not asked (it failed just now)."""

    @property
    def model_free(self) -> bool:
        """BM25 calls no model (a turn may recall on its shared store connection); an embedder
        is one (`ModelFree`)."""
        return self.embedder is None

    def _entry(self, tenant: str, session_id: str) -> _Entry:
        key = (tenant, session_id)
        entry = self._entries.get(key)
        if entry is None:
            dense = DenseIndex(self.embedder) if self.embedder is not None else None
            entry = self._entries[key] = _Entry(index=self._index_factory(), dense=dense)
            while len(self._entries) > self._max_sessions:
                self._entries.popitem(last=False)
        self._entries.move_to_end(key)
        return entry

    def forget(self, tenant: str, session_id: str) -> bool:
        """Drop a session's index and stored-index caches (after the session is deleted);
        True if this process held an index of it."""
        stored = self._stored.forget(tenant, session_id)
        return (self._entries.pop((tenant, session_id), None) is not None) or stored

    def cached_sessions(self) -> list[tuple[str, str]]:
        """``(tenant, session_id)`` of every index (or cached block of a stored index) held
        in this process."""
        return list(dict.fromkeys([*self._entries, *self._stored.sessions()]))

    async def index(
        self, store: TurnSource, tenant: str, session_id: str, *, last_seq: int
    ) -> RecallIndex:
        """The session's BM25 index, caught up to ``last_seq`` from the store."""
        entry = self._entry(tenant, session_id)
        async with entry.lock:
            await self._catch_up(entry, store, tenant, session_id, last_seq)
        return entry.index

    async def _catch_up(
        self, entry: _Entry, store: TurnSource, tenant: str, session_id: str, last_seq: int,
        *, embed: bool = True,
    ) -> None:
        """Index the turns up to ``last_seq`` not indexed yet (caller holds ``entry.lock``);
        ``embed=False``: the BM25 index alone."""
        dense = entry.dense if embed else None
        indexes: list[BM25Index | DenseIndex] = [entry.index]
        if dense is not None:
            indexes.append(dense)
        done = min(i.last_seq for i in indexes)
        while done < last_seq:
            stop = min(last_seq, done + self.settings.batch)
            turns = await store.turns(SessionKey(tenant, session_id), from_seq=done + 1, to_seq=stop)
            if not turns:
                break
            if dense is not None or len(turns) >= _THREAD_BATCH:
                # A first build (or embeddings) takes long enough to stall replies:
                # do it in a worker thread. Safe: we hold the entry's lock, and
                # observe() stays away from an index whose lock is held.
                await asyncio.to_thread(_add_all, entry.index, dense, turns)
            else:
                _add_all(entry.index, dense, turns)
            done = turns[-1].seq

    def observe(self, tenant: str, session_id: str, turns: Sequence[Turn]) -> None:
        """Index turns just appended (the engine calls this after persisting a turn).

        Only the BM25 index is updated here (microseconds); embeddings, which
        cost milliseconds, are computed at the next `recall`, off the write
        path. Turns out of order (a gap since the last indexed one) are left
        for the next `recall` to read from the store.
        """
        entry = self._entry(tenant, session_id)
        if entry.lock.locked():  # a catch-up may be writing from a thread; it reads these later
            return
        for turn in turns:
            if turn.seq == entry.index.last_seq + 1:
                entry.index.add(turn)

    def rank(
        self,
        index: RecallIndex,
        message: str,
        *,
        recent: Sequence[Turn] = (),
        exclude_from_seq: int | None = None,
        dense: DenseIndex | None = None,
    ) -> list[RecallHit]:
        """Hits for ``message``, best first, neighbours placed by their discounted score."""
        settings = self.settings
        counts = index if isinstance(index, BM25Index) else None
        weights = recall_query(message, recent, settings, counts=counts)
        k = settings.candidates
        if isinstance(index, BM25Index):
            memo = QueryMemo()  # shared by both passes: the feedback pass adds only its terms
            found = index.search_terms(weights, k=k, exclude_from_seq=exclude_from_seq, memo=memo)
            if settings.feedback_turns and found:
                expanded = _feedback(index, weights, found[: settings.feedback_turns], settings)
                found = index.search_terms(expanded, k=k, exclude_from_seq=exclude_from_seq, memo=memo)
        else:
            found = index.search(message, k=k, exclude_from_seq=exclude_from_seq)
        if dense is not None:
            found = _fuse(found, dense, message, k=k, exclude_from_seq=exclude_from_seq, settings=settings)
        hits = [RecallHit(seq=seq, score=score) for seq, score in found]
        if settings.neighbours:
            hits = _with_neighbours(hits, settings.neighbour_weight, settings.following_weight)
        return hits

    async def recall(
        self,
        store: TurnSource,
        state: SessionState,
        message: str,
        *,
        recent_turns: int = 6,
        limit: int | None = None,
    ) -> list[Turn]:
        """Older turns relevant to ``message``, best first, read from ``store``.

        Turns among the newest ``recent_turns`` are left out (the recent
        window shows them; pass the strategy's ``recent_turns``, default
        `HybridRecall`'s 6). ``limit`` caps how many turns come back
        (default: all ranked hits and their neighbours).
        """
        if state.last_seq == 0:
            return []
        exclude_from = max(1, state.last_seq - recent_turns + 1)
        source = store
        if has_postings(store) and self.embedder is None:
            async with one_connection(store):  # PostgreSQL: one pool acquisition for all the reads
                stats = await store.index_stats(SessionKey(state.tenant, state.session_id))
                if stats.exists and stats.indexed_seq >= state.last_seq:
                    hits = await self.rank_stored(store, source, state, message, stats, exclude_from)
                    return await self._turns_of(source, state, message, hits, limit, "bm25")
        entry = self._entry(state.tenant, state.session_id)
        if entry.created_at is not None and state.created_at != entry.created_at:
            self.forget(state.tenant, state.session_id)
            entry = self._entry(state.tenant, state.session_id)
        entry.created_at = state.created_at
        async with entry.lock:  # no catch-up thread may grow the arrays while we search them
            hits, ranker = await self._ranked(entry, store, state, message, exclude_from)
        return await self._turns_of(store, state, message, hits, limit, ranker)

    async def _ranked(
        self, entry: _Entry, store: TurnSource, state: SessionState, message: str, exclude_from: int
    ) -> tuple[list[RecallHit], str]:
        """The session's hits and their ranker (caller holds ``entry.lock``): BM25 fused with the
        embedder's ranking, or BM25 alone while the embedder fails (its server down: logged, and
        not asked again for `DENSE_PAUSE_S` seconds; a turn never fails for it)."""
        dense = entry.dense if time.monotonic() >= self._dense_paused_until else None
        if dense is not None:
            try:
                await self._catch_up(entry, store, state.tenant, state.session_id, state.last_seq)
                rank = partial(self.rank, entry.index, message, recent=state.turns,
                               exclude_from_seq=exclude_from, dense=dense)
                # The query's embedding (a model, maybe a server) runs in a worker thread, as the
                # catch-up does: the loop keeps serving. BM25 alone stays on the loop (microseconds).
                return await asyncio.to_thread(rank), "bm25+dense"
            except ModelError as exc:
                self._dense_paused_until = time.monotonic() + DENSE_PAUSE_S
                log.warning("recall: BM25 alone for %.0f s, the embedder failed: %s", DENSE_PAUSE_S, exc)
        await self._catch_up(entry, store, state.tenant, state.session_id, state.last_seq, embed=False)
        hits = self.rank(entry.index, message, recent=state.turns, exclude_from_seq=exclude_from)
        return hits, "bm25"

    async def _turns_of(
        self, store: TurnSource, state: SessionState, message: str, hits: list[RecallHit],
        limit: int | None, ranker: str,
    ) -> list[Turn]:
        if limit is not None:
            hits = hits[:limit]
        if not hits:
            return []
        settings = self.settings
        wanted = [h.seq for h in hits]
        if settings.answers:  # read the turn after each hit too: it is the answer when the hit asks
            wanted += [h.seq + 1 for h in hits if h.neighbour_of is None]
        by_seq = await fetch_turns(store, state.tenant, state.session_id, wanted)
        if settings.answers:
            hits = with_answers(hits, by_seq, settings.neighbour_weight)[:limit]
        hits = focus_on_speakers(message, hits, by_seq, settings)
        # Each recalled turn says why it is here (the inspector shows it; never stored).
        return [_with_reason(by_seq[h.seq], h, ranker) for h in hits if h.seq in by_seq]

    async def rank_stored(
        self,
        store: PostingsStore,
        source: TurnSource,
        state: SessionState,
        message: str,
        stats: IndexStats,
        exclude_from_seq: int,
    ) -> list[RecallHit]:
        """`rank` over the index the store keeps: reads the query terms' postings, no turns."""
        settings = self.settings
        index = await self._stored.index(
            store, state.tenant, state.session_id, stats=stats, created_at=state.created_at
        )
        # One read: the query's own terms' postings, and its neighbours' frequencies with the
        # postings of those the cost guard keeps (`semantic_max_share`, `semantic_max_df`).
        always, near = query_reads(message, state.turns, settings)
        await index.load_terms(
            always, capped=near, cap=int(semantic_cap(settings, index.docs)), most=settings.semantic_max_terms
        )
        weights = recall_query(message, state.turns, settings, counts=index)
        await index.load_terms(list(weights))  # nothing left to read: a no-op
        k = settings.candidates
        found = index.search_terms(weights, k=k, exclude_from_seq=exclude_from_seq)
        if settings.feedback_turns and found:
            top = found[: settings.feedback_turns]

            async def read(seqs: Sequence[int]) -> dict[int, Turn]:
                return await fetch_turns(source, state.tenant, state.session_id, seqs)

            await index.load_doc_terms([seq for seq, _ in top], read)
            await index.load_df([t for seq, _ in top for t in index.doc_terms(seq)])
            expanded = _feedback(index, weights, top, settings)
            await index.load_terms([t for t in expanded if t not in weights])
            found = index.search_terms(expanded, k=k, exclude_from_seq=exclude_from_seq)
        hits = [RecallHit(seq=seq, score=score) for seq, score in found]
        if settings.neighbours:
            hits = _with_neighbours(hits, settings.neighbour_weight, settings.following_weight)
        return hits


def named_speakers(message: str, speakers: Iterable[str]) -> set[str]:
    """The ``speakers`` whose name ``message`` contains as a whole word (case-insensitive;
    a Chinese name as a substring, since Chinese has no spaces).

    A name that only addresses someone ("Luna, do you remember my sister?", "…, Luna?",
    "小红，你还记得吗") does not count: the message talks *to* that speaker, not about them.
    """
    text = message.casefold()
    named = set()
    for name in speakers:
        key = name.strip().casefold()
        if not key:
            continue
        name_re = re.escape(key) if is_chinese(key) else rf"(?<!\w){re.escape(key)}(?!\w)"
        about = re.sub(_VOCATIVE.format(name=name_re), " ", text)
        if re.search(name_re, about):
            named.add(name)
    return named


_VOCATIVE = r"^\W*(?:(?:hey|hi|hello|dear)\s+)?{name}\s*[,，:：!！]|[,，]\s*{name}\W*$"
"""A name at the start followed by a comma, or at the end after one: the addressee."""


def focus_on_speakers(
    message: str, hits: list[RecallHit], turns: Mapping[int, Turn], settings: RecallSettings
) -> list[RecallHit]:
    """``hits`` re-ranked towards the speakers the message names.

    A question about one person ("What activities does Melanie partake in?") is answered
    by what that person said: when the message names some but not all of the speakers
    among the candidate turns (``metadata["speaker"]``), a turn spoken by a named speaker
    (hit or neighbour) scores ``settings.speaker_focus`` times its score; with
    ``settings.focus_neighbours`` a neighbour instead keeps its share of its hit's new
    score, whoever said it. Without speaker names, or when every speaker is named, the
    order is unchanged. Both index paths re-rank here, after reading the turns, so they
    stay identical.
    """
    if settings.speaker_focus == 1.0 or not hits:
        return hits
    speaker_of = {
        seq: speaker for seq, turn in turns.items()
        if isinstance(speaker := turn.metadata.get("speaker"), str) and speaker
    }
    present = set(speaker_of.values())
    named = named_speakers(message, present)
    if not named or named == present:
        return hits
    factor = {
        seq: settings.speaker_focus if speaker in named else 1.0 for seq, speaker in speaker_of.items()
    }

    def lifted(hit: RecallHit) -> RecallHit:
        by = hit.neighbour_of if settings.focus_neighbours and hit.neighbour_of is not None else hit.seq
        return replace(hit, score=hit.score * factor.get(by, 1.0))

    focused = [lifted(h) for h in hits]
    focused.sort(key=lambda h: (-h.score, h.neighbour_of is not None, -h.seq))
    return focused


def _asks(turn: Turn) -> bool:
    """Whether ``turn`` asks something (a question mark in it, ASCII or full-width)."""
    return "?" in turn.content or "？" in turn.content


def with_answers(hits: list[RecallHit], turns: Mapping[int, Turn], weight: float) -> list[RecallHit]:
    """``hits`` plus, after each hit that asks something (a question mark in it), the turn that
    follows it (read into ``turns``; not a system turn or an engine notice), ranked at ``weight`` × the hit's score; best first, as `_with_neighbours` orders.

    A question's answer is the next turn ("What did you make in pottery class?" → "Bowls and a
    cup!"): the index lends the answer the question's words at half weight, so the question
    itself ranks first and the answer often not at all.
    """
    taken = {h.seq for h in hits}
    extra = []
    for hit in hits:
        turn = turns.get(hit.seq)
        if hit.neighbour_of is None and turn is not None and _asks(turn):
            seq = hit.seq + 1
            if seq not in taken and seq in turns and indexed(turns[seq]):
                taken.add(seq)
                extra.append(RecallHit(seq=seq, score=hit.score * weight, neighbour_of=hit.seq))
    if not extra:
        return hits
    merged = hits + extra
    merged.sort(key=lambda h: (-h.score, h.neighbour_of is not None, -h.seq))
    return merged


def _with_reason(turn: Turn, hit: RecallHit, ranker: str) -> Turn:
    reason: dict[str, float | int | str] = {"score": round(hit.score, 4), "ranker": ranker}
    if hit.neighbour_of is not None:
        reason["neighbour_of"] = hit.neighbour_of
    metadata = {**turn.metadata, "recall": reason}
    if type(turn) is not Turn:
        return replace(turn, metadata=metadata)
    # `dataclasses.replace` without its per-call field walk (~2x faster; up to 128 turns a recall).
    return Turn(**{name: getattr(turn, name) for name in _TURN_FIELDS}, metadata=metadata)


_TURN_FIELDS = tuple(f.name for f in fields(Turn) if f.init and f.name != "metadata")


@dataclass(frozen=True, kw_only=True)
class RecallReason:
    """Why a turn was recalled, for the inspector."""

    seq: int
    score: float | None
    """Its ranking score (BM25, or the fused score with dense retrieval); a neighbour's is its hit's × 0.5."""
    matched: tuple[str, ...]
    """Query terms (the message's, or borrowed/feedback ones) found in the turn."""
    neighbour_of: int | None = None
    """Set when the turn came in as the turn before hit ``neighbour_of`` (or after it: the
    answer to a hit that asks)."""
    ranker: str = ""
    """``bm25``, or ``bm25+dense`` (BM25 and embedding ranks fused)."""


def explain_recall(
    message: str, recent: Sequence[Turn], recalled: Sequence[Turn], settings: RecallSettings | None = None
) -> list[RecallReason]:
    """For each recalled turn (as `Recaller.recall` returned it): score and matched terms."""
    weights = recall_query(message, recent, settings or RecallSettings())
    out = []
    for turn in recalled:
        reason = turn.metadata.get("recall")
        info = reason if isinstance(reason, dict) else {}
        terms = set(analyze(turn_text(turn)))
        out.append(RecallReason(
            seq=turn.seq,
            score=info.get("score"),
            matched=tuple(t for t in weights if t in terms),
            neighbour_of=info.get("neighbour_of"),
            ranker=str(info.get("ranker", "")),
        ))
    return out


def _add_all(index: BM25Index, dense: DenseIndex | None, turns: Sequence[Turn]) -> None:
    for turn in turns:
        index.add(turn)
    if dense is not None:
        dense.add_many(turns)


class _TermStats(Protocol):
    def doc_terms(self, seq: int) -> tuple[str, ...]: ...

    def idf(self, term: str) -> float: ...


def _feedback(
    index: _TermStats,
    weights: Mapping[str, float],
    top: Sequence[tuple[int, float]],
    settings: RecallSettings,
) -> dict[str, float]:
    """``weights`` plus the most specific terms of the best hits (RM3-style, unweighted by score)."""
    pooled: dict[str, float] = {}
    for seq, _ in top:
        for term in index.doc_terms(seq):
            pooled[term] = pooled.get(term, 0.0) + index.idf(term)
    expanded = dict(weights)
    added = 0
    for term in sorted(pooled, key=lambda t: (-pooled[t], t)):
        if added >= settings.feedback_terms:
            break
        if term not in expanded:
            expanded[term] = settings.feedback_weight
            added += 1
    return expanded


def _fuse(
    found: list[tuple[int, float]], dense: DenseIndex, message: str, *, k: int,
    exclude_from_seq: int | None, settings: RecallSettings,
) -> list[tuple[int, float]]:
    """BM25's hits fused with the dense ranking (``settings.fusion``); BM25's alone for a
    Chinese message when the embedder only knows English."""
    if english_only(dense.embedder) and is_chinese(message):
        return found
    if settings.fusion == "rrf":
        similar = dense.search(message, k=k, exclude_from_seq=exclude_from_seq)
        return rrf_fuse([[s for s, _ in found], [s for s, _ in similar]], k=settings.rrf_k)[:k]
    seqs, sims = dense.similarities(message, exclude_from_seq=exclude_from_seq)
    return convex_fuse(found, seqs, sims, weight=settings.dense_weight, k=k)


def _with_neighbours(hits: list[RecallHit], weight: float, following: float = 0.0) -> list[RecallHit]:
    """Each hit followed by the turn before it, ranked at ``weight`` × the hit's score
    (and by the turn after it at ``following`` × the score, when above 0)."""
    taken = {h.seq for h in hits}
    extra = []
    for hit in hits:
        # A turn after the newest hits may be in the recent window: the strategy drops it there.
        for seq, factor in ((hit.seq - 1, weight), (hit.seq + 1, following)):
            if factor > 0 and seq >= 1 and seq not in taken:
                taken.add(seq)
                extra.append(RecallHit(seq=seq, score=hit.score * factor, neighbour_of=hit.seq))
    merged = hits + extra
    merged.sort(key=lambda h: (-h.score, h.neighbour_of is not None, -h.seq))
    return merged


async def fetch_turns(
    store: TurnSource, tenant: str, session_id: str, seqs: Sequence[int]
) -> dict[int, Turn]:
    """Turns by seq: in one call when the store reads scattered seqs (`TurnsAt`), else
    in as few contiguous ranges as the seqs allow."""
    wanted = sorted(set(seqs))
    out: dict[int, Turn] = {}
    if reads_turns_at(store):
        if wanted:
            out = {turn.seq: turn for turn in await store.turns_at(SessionKey(tenant, session_id), wanted)}
        return {seq: out[seq] for seq in wanted if seq in out}
    start = 0
    while start < len(wanted):
        end = start
        # Merge seqs that are close together into one range read (gap of at most 4).
        while end + 1 < len(wanted) and wanted[end + 1] - wanted[end] <= 4:
            end += 1
        for turn in await store.turns(
            SessionKey(tenant, session_id), from_seq=wanted[start], to_seq=wanted[end]
        ):
            out[turn.seq] = turn
        start = end + 1
    return {seq: out[seq] for seq in wanted if seq in out}
