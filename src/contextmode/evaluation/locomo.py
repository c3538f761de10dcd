"""Evidence recall on LoCoMo: does the assembled context still hold the turns a question needs?

Measured as shipped: each LoCoMo conversation (≈300–700 turns over 19–32 dated
sessions) is recorded through the real `Engine` built by `build_engine` with the
shipped `EngineSettings` and offline processors (`Engine.record`, which runs the
same background jobs a live turn schedules: emotion and constraint extraction on
the user's turns, the summary when due). Then each question of categories 1–4
(multi-hop, temporal, open-domain, single-hop; 5 is adversarial and has no
evidence) is asked at the end of the conversation through `Engine.prepare`
(detection, rewrite, recall, assembly) with ``budget`` tokens of input, every
layer counted with cl100k, and we measure

- ``recall``: share of the question's evidence turns (``dia_id``) present
  verbatim in the context (recent window, key moments or recall layer);
- ``summary_only``: share not present verbatim but carried by the summary that
  is in the context: at least one sentence of the turn (12+ characters) appears
  in the summary as shown (the offline summariser is extractive, so a kept
  fact keeps its words);
- ``tokens``: the mean tokens the whole context used.

Speakers: ``speaker_a`` is the user, ``speaker_b`` the assistant; both names
are kept in each turn's metadata (``speaker``) and indexed for recall. A shared
photo's caption is appended to its turn's text ("[shares a photo: …]"), as an
application that stores image descriptions would. Turn times are the session's
date. Options that depart from the shipped configuration (`EvalOptions`) are
listed in the result's ``departures``.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from ..assembly import Context, assemble
from ..engine import Engine
from ..engine.prepare import without_notices
from ..errors import InputError, MessageTooLarge, MissingExtra
from ..memory import Strategy, get_strategy
from ..memory.budget import Budget
from ..memory.recall import Recaller, RecallSettings
from ..memory.recall.strategy import DefaultStrategy
from ..memory.strategies import MemoryPlan
from ..settings import EngineSettings
from ..store.base import Store
from ..store.memory import MemoryStore
from ..tokens.base import TokenCounter
from ..types import SessionKey, SessionState
from .report import Steps, print_json_line, print_table, progress_steps

__all__ = ["CATEGORIES", "EvalOptions", "evaluate_locomo", "load_locomo", "plot_recall", "register"]

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
BASELINES = ("bm25_recent", "newest")
"""Eval-only baselines (never product strategies): ``bm25_recent`` is plain BM25 over the
turns (no neighbours, expansion, feedback or speaker focus) sharing the budget half and half
with the newest turns; ``newest`` is the newest turns only. Both go through the same assembler
(system prompt, exact counting) with no summary, pins or key moments."""
VARIANTS = ("default_with_key_moments",)
"""Eval-only variants of the shipped default: ``default_with_key_moments`` is the default with
a key-moment layer (three, as ``hybrid_recall``), to report the layer with and without it."""
_BASELINE_TAIL = 400
"""Turns the baselines load (the newest; a 4,000-token budget holds about 150 LoCoMo turns)."""
_TENANT = "locomo"
_VERBATIM_LAYERS = ("recent", "key_moments", "recall")
_SENTENCE = re.compile(r"[^.!?。！？\n]+")


@dataclass(frozen=True, kw_only=True)
class LocomoTurn:
    dia_id: str
    speaker: str
    text: str
    """The utterance, with a shared photo's caption appended."""
    at: datetime


@dataclass(frozen=True, kw_only=True)
class LocomoQuestion:
    question: str
    evidence: tuple[str, ...]
    category: int


@dataclass(frozen=True, kw_only=True)
class LocomoConversation:
    sample_id: str
    speaker_a: str
    speaker_b: str
    turns: tuple[LocomoTurn, ...]
    questions: tuple[LocomoQuestion, ...]


def _session_date(value: str) -> datetime:
    # "1:56 pm on 8 May, 2023"
    try:
        return datetime.strptime(value.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)
    except ValueError as exc:
        raise InputError(f"unrecognised LoCoMo session date {value!r}") from exc


def load_locomo(path: str | Path) -> list[LocomoConversation]:
    """Parse a LoCoMo JSON file (a list of conversations with ``qa``)."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read LoCoMo file {path}: {exc}") from exc
    conversations: list[LocomoConversation] = []
    for sample in raw:
        conv = sample["conversation"]
        turns: list[LocomoTurn] = []
        n = 1
        while f"session_{n}" in conv:
            at = _session_date(conv[f"session_{n}_date_time"])
            for item in conv[f"session_{n}"]:
                text = str(item.get("text", ""))
                if item.get("blip_caption"):
                    text = f"{text} [shares a photo: {item['blip_caption']}]"
                turns.append(
                    LocomoTurn(dia_id=item["dia_id"], speaker=item["speaker"], text=text, at=at)
                )
            n += 1
        questions = tuple(
            LocomoQuestion(
                question=str(qa["question"]),
                evidence=tuple(str(e) for e in qa.get("evidence", ())),
                category=int(qa["category"]),
            )
            for qa in sample.get("qa", ())
        )
        conversations.append(
            LocomoConversation(
                sample_id=str(sample.get("sample_id", f"conv-{len(conversations) + 1}")),
                speaker_a=conv["speaker_a"],
                speaker_b=conv["speaker_b"],
                turns=tuple(turns),
                questions=questions,
            )
        )
    return conversations


@dataclass(frozen=True, kw_only=True)
class EvalOptions:
    """How the conversation is replayed; anything but the defaults departs from what ships."""

    preferences_only: bool = False
    """Pin only stated preferences and constraints (the extractor's ``generic_facts=False``),
    not every first-person fact the shipped extractor keeps."""
    embeddings: bool = False
    """Fuse dense retrieval (the ``embeddings`` extra, not on by default) into recall."""
    store_url: str | None = None
    """Replay into this store (``sqlite:///…``, ``postgresql://…``, ``redis://…``); default memory."""
    recorded_strategy: str | None = None
    """Record the conversation with this strategy's background jobs (when its summary is due)
    instead of the shipped one's: how another strategy (the prompt-cache preset) is measured as it would run."""
    order: str | None = None
    """Assemble in this layer order preset instead of the shipped one."""

    def departures(self) -> list[str]:
        """What differs from the shipped configuration, in words, for the report."""
        out = []
        shipped = EngineSettings().strategy
        if self.recorded_strategy not in (None, shipped):
            out.append(f"recorded with strategy {self.recorded_strategy} (shipped: {shipped})")
        if self.order not in (None, EngineSettings().order):
            out.append(f"layer order {self.order} (shipped: {EngineSettings().order})")
        if self.preferences_only:
            out.append("constraint extractor generic_facts=False (shipped: True)")
        if self.embeddings:
            out.append("dense fusion on (shipped: off)")
        return out


@dataclass(frozen=True, kw_only=True)
class _Baseline:
    """A baseline as a strategy: every loaded turn as recent, recall as found (see `BASELINES`)."""

    name: str
    recent_turns: int = _BASELINE_TAIL
    key_moment_limit: int = 0

    def plan(self, state: SessionState, message: str, *, now: datetime) -> MemoryPlan:
        if self.name == "newest":
            return MemoryPlan(recent=tuple(state.turns), shares={"recent": 1.0})
        return MemoryPlan(recent=tuple(state.turns), recall=tuple(state.recalled),
                          shares={"recall": 0.5, "recent": 0.5})


def _plain_bm25() -> Recaller:
    """BM25 over the turns and nothing else (the ``bm25_recent`` baseline's recaller)."""
    return Recaller(RecallSettings(
        neighbours=False, answers=False, expansion_turns=0, feedback_turns=0, semantic_neighbours=0,
        speaker_focus=1.0,
    ))


def _strategy(name: str | Strategy) -> Strategy:
    """A strategy by name, the eval-only baselines and variants included."""
    if name in BASELINES:
        return _Baseline(name=str(name))
    if name == "default_with_key_moments":
        return DefaultStrategy(max_key_moments=3, name="default_with_key_moments")
    return get_strategy(name)


async def _baseline_context(
    engine: Engine, sid: str, question: str, strategy: _Baseline, budget: int, plain: Recaller,
) -> Context | None:
    """What a baseline sends for ``question`` with ``budget`` tokens of input."""
    state = await engine.store.load(SessionKey(_TENANT, sid), recent=_BASELINE_TAIL, max_uncovered=_BASELINE_TAIL)
    state = replace(without_notices(state), summary=None, constraints=(), key_moments=())
    if strategy.name == "bm25_recent":
        found = await plain.recall(engine.store, state, question, limit=128, recent_turns=0)
        state = replace(state, recalled=tuple(found))
    try:
        return assemble(state, question, counter=engine.counter, strategy=strategy,
                        budget=Budget(context_window=budget, reply_reserve=0), config=engine.assembly_config())
    except MessageTooLarge:
        return None


def _engine(store: Store, counter: TokenCounter, options: EvalOptions, recaller: Recaller) -> Engine:
    """The shipped engine (default settings, offline processors) on ``store``."""
    from ..api import build_engine
    from ..engine import Processors
    from ..models.offline import OfflineResponder
    from ..processors.constraints import OfflineConstraintExtractor

    processors = Processors.offline()
    if options.preferences_only:
        processors = replace(processors, extractor=OfflineConstraintExtractor(generic_facts=False))
    return build_engine(
        store=store, model=OfflineResponder(), counter=counter,
        settings=replace(EngineSettings(), strategy=options.recorded_strategy or EngineSettings().strategy,
                         order=options.order or EngineSettings().order),
        processors=processors, recaller=recaller,
    )


async def _replay(engine: Engine, conv: LocomoConversation, sid: str) -> dict[str, int]:
    """Record the conversation through the engine, running its jobs; return dia_id → seq.

    `Engine.record` schedules what a live turn schedules (emotion and constraints of the
    user's turns, the summary when due); draining after each user turn keeps the replay
    in conversation order.
    """
    seq_of: dict[str, int] = {}
    for lt in conv.turns:
        role: Literal["user", "assistant"] = "user" if lt.speaker == conv.speaker_a else "assistant"
        turn = await engine.record(
            _TENANT, sid, role, lt.text, created_at=lt.at,
            metadata={"speaker": lt.speaker, "dia_id": lt.dia_id},
        )
        seq_of[lt.dia_id] = turn.seq
        if role == "user":
            await engine.drain()
    await engine.drain()
    return seq_of


def _cl100k() -> TokenCounter:
    from ..tokens import counter_for_encoding

    return counter_for_encoding("cl100k_base")


def _new_cell() -> dict[str, Any]:
    return {"found": 0.0, "summary": 0.0, "n": 0, "tokens": 0, "by_cat": {}, "by_conv": {}}


def _session_id(conv: LocomoConversation, run: str) -> str:
    return f"{run}{conv.sample_id.replace(' ', '_')}"


async def _evaluate(
    path: str | Path,
    budgets: Sequence[int],
    strategies: Sequence[str | Strategy],
    *,
    progress: bool,
    counter: TokenCounter,
    recaller: Recaller,
    options: EvalOptions,
) -> dict[str, Any]:
    from ..store import open_store

    conversations = load_locomo(path)
    chosen = [_strategy(s) for s in strategies]
    cells = {(s.name, b): _new_cell() for s in chosen for b in budgets}
    run = f"r{uuid.uuid4().hex[:8]}-" if options.store_url else ""
    total = sum(len(_asked(conv)) for conv in conversations)
    with progress_steps("LoCoMo", total, progress) as step:
        for ci, conv in enumerate(conversations, 1):
            store = open_store(options.store_url) if options.store_url else MemoryStore()
            engine = _engine(store, counter, options, recaller)
            sid = _session_id(conv, run)
            try:
                step.describe(f"{conv.sample_id} ({ci}/{len(conversations)}): replaying {len(conv.turns)} turns")
                seq_of = await _replay(engine, conv, sid)
                step.describe(f"{conv.sample_id} ({ci}/{len(conversations)}): questions")
                await _ask(engine, conv, sid, seq_of, chosen, budgets, cells, step)
            finally:
                if options.store_url:
                    await store.delete(SessionKey(_TENANT, sid))
                await engine.close()
    return _report(cells, chosen, budgets, counter, options)


def _asked(conv: LocomoConversation) -> list[LocomoQuestion]:
    """The questions asked of ``conv``: categories 1-4 (5, adversarial, has no evidence to find)."""
    return [q for q in conv.questions if q.category in CATEGORIES]


async def _ask(
    engine: Engine, conv: LocomoConversation, sid: str, seq_of: dict[str, int],
    chosen: Sequence[Strategy], budgets: Sequence[int],
    cells: dict[tuple[str, int], dict[str, Any]], step: Steps,
) -> None:
    """Ask every question of categories 1–4 at the end of the conversation; fill ``cells``."""
    text_of = {seq_of[t.dia_id]: t.text for t in conv.turns}
    now = conv.turns[-1].at + timedelta(hours=1) if conv.turns else datetime.now(UTC)
    plain = _plain_bm25()
    for qa in _asked(conv):
        evidence = [seq_of[e] for e in qa.evidence if e in seq_of]
        if evidence:
            sentences = [_sentences(text_of[seq]) for seq in evidence]
            for strategy in chosen:
                for budget in budgets:
                    cell = cells[(strategy.name, budget)]
                    if isinstance(strategy, _Baseline):
                        ctx = await _baseline_context(engine, sid, qa.question, strategy, budget, plain)
                    else:
                        ctx = await _context(engine, sid, qa.question, strategy, budget, now)
                    _add(cell, conv.sample_id, _score(cell, ctx, qa, evidence, sentences))
        step()


def _add(cell: dict[str, Any], sample_id: str, found: float) -> None:
    conv_cell = cell["by_conv"].setdefault(sample_id, [0.0, 0])
    conv_cell[0] += found
    conv_cell[1] += 1


async def _context(
    engine: Engine, sid: str, question: str, strategy: Strategy, budget: int, now: datetime
) -> Context | None:
    """What the engine would send for ``question`` with ``budget`` tokens of input
    (``None`` when the question alone does not fit)."""
    engine.settings = replace(engine.settings, context_window=budget, reply_reserve=0)
    try:
        prepared = await engine.prepare(_TENANT, sid, question, strategy=strategy, now=now)
    except MessageTooLarge:
        return None
    return prepared.context


def _sentences(text: str) -> list[str]:
    return [m.group().strip() for m in _SENTENCE.finditer(text) if len(m.group().strip()) >= 12]


def _score(
    cell: dict[str, Any], ctx: Context | None, qa: LocomoQuestion, evidence: list[int],
    sentences: list[list[str]],
) -> float:
    """Add one question's outcome to ``cell``; return its evidence recall."""
    if ctx is None:
        found, via_summary, tokens = 0.0, 0.0, 0
    else:
        shown = {item.seq for layer in ctx.layers if layer.name in _VERBATIM_LAYERS
                 for item in layer.items if item.seq is not None}
        layer = ctx.layer("summary")
        summary_text = "\n".join(item.text for item in layer.items) if layer else ""
        hit = sum(seq in shown for seq in evidence)
        through_summary = sum(
            seq not in shown and any(s in summary_text for s in sents)
            for seq, sents in zip(evidence, sentences, strict=True)
        )
        found, via_summary = hit / len(evidence), through_summary / len(evidence)
        tokens = ctx.total_tokens
    cell["found"] += found
    cell["summary"] += via_summary
    cell["n"] += 1
    cell["tokens"] += tokens
    cat = cell["by_cat"].setdefault(qa.category, [0.0, 0])
    cat[0] += found
    cat[1] += 1
    return found


def _report(
    cells: dict[tuple[str, int], dict[str, Any]], chosen: Sequence[Strategy],
    budgets: Sequence[int], counter: TokenCounter, options: EvalOptions,
) -> dict[str, Any]:
    table: dict[str, dict[str, Any]] = {}
    recall: dict[str, dict[str, float]] = {}
    for strategy in chosen:
        for budget in budgets:
            cell = cells[(strategy.name, budget)]
            n = max(1, cell["n"])
            row = {
                "recall": round(cell["found"] / n, 4),
                "summary_only": round(cell["summary"] / n, 4),
                "tokens": round(cell["tokens"] / n, 1),
                "questions": cell["n"],
                "by_category": {
                    CATEGORIES[c]: round(v[0] / max(1, v[1]), 4)
                    for c, v in sorted(cell["by_cat"].items())
                },
                "by_conversation": {
                    sid: round(v[0] / max(1, v[1]), 4) for sid, v in cell["by_conv"].items()
                },
            }
            table.setdefault(strategy.name, {})[str(budget)] = row
            recall.setdefault(strategy.name, {})[str(budget)] = row["recall"]
    return {
        "counter": counter.name,
        "entry": "Engine.record / Engine.prepare, shipped EngineSettings and offline processors",
        "budget": "input tokens (context_window = budget, reply_reserve = 0)",
        "store": _store_name(options.store_url),
        "departures": options.departures(),
        "eval_only": [s.name for s in chosen if s.name in (*BASELINES, *VARIANTS)],
        "recall": recall,
        "table": table,
    }


def _store_name(url: str | None) -> str:
    return url.split(":", 1)[0] if url else "memory"


def evaluate_locomo(
    path: str | Path,
    budgets: Sequence[int],
    strategies: Sequence[str | Strategy],
    *,
    progress: bool = True,
    counter: TokenCounter | None = None,
    recaller: Recaller | None = None,
    options: EvalOptions | None = None,
) -> dict[str, Any]:
    """Evidence recall per strategy and budget on a LoCoMo file (see the module docstring).

    Returns ``{"counter", "entry", "budget", "store", "departures", "recall": {strategy:
    {budget: overall}}, "table": {strategy: {budget: {recall, summary_only, tokens,
    questions, by_category, by_conversation}}}}``; ``departures`` names every option
    that differs from the shipped configuration (empty when measured as shipped).
    """
    options = options or EvalOptions()
    if recaller is None:
        embedder = None
        if options.embeddings:
            from ..memory.recall.dense import MiniLMEmbedder

            embedder = MiniLMEmbedder()
        recaller = Recaller(RecallSettings(), embedder=embedder)
    return asyncio.run(_evaluate(
        path, list(budgets), list(strategies), progress=progress,
        counter=counter or _cl100k(), recaller=recaller, options=options,
    ))


def _print_table(result: dict[str, Any]) -> None:
    cats = list(CATEGORIES.values())
    rows = []
    for name, by_budget in result["table"].items():
        for budget, row in by_budget.items():
            cells = [name, budget, f"{row['recall']:.3f}"]
            cells += [f"{row['by_category'].get(c, 0.0):.3f}" for c in cats]
            cells += [f"{row['summary_only']:.3f}", f"{row['tokens']:.0f}", str(row["questions"])]
            rows.append(cells)
    print_table(
        f"LoCoMo evidence recall ({result['counter']}, store: {result['store']})",
        ["strategy", "budget", "recall", *cats, "summary-only", "tokens", "questions"], rows,
    )


def plot_recall(result: dict[str, Any], path: str | Path) -> Path:
    """Write a PNG of overall evidence recall against the budget, one line per strategy."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingExtra("plot", "matplotlib") from exc
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for name, by_budget in result["recall"].items():
        budgets = sorted(by_budget, key=int)
        ax.plot([int(b) for b in budgets], [by_budget[b] for b in budgets], marker="o", label=name)
    ax.set_xlabel(f"total context budget (tokens, {result.get('counter', 'cl100k_base')})")
    ax.set_ylabel("evidence turns kept verbatim")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title("LoCoMo evidence recall vs budget (categories 1-4)")
    ax.legend(loc="center right", fontsize=8)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def register(app: typer.Typer) -> None:
    """Add the ``locomo`` evaluation subcommand to ``app``."""

    @app.command("locomo")
    def locomo_command(
        data: Annotated[Path, typer.Option("--data", help="LoCoMo JSON file")],
        budget: Annotated[str, typer.Option(help="Comma-separated total token budgets")] = "1000,2000,4000",
        strategy: Annotated[
            str, typer.Option(help="Comma-separated strategies; eval-only: bm25_recent and newest "
                                   "(baselines), default_with_key_moments")
        ] = "default,default_with_key_moments,bm25_recent,newest",
        embeddings: Annotated[
            bool, typer.Option("--embeddings", help="Fuse dense retrieval into recall (extra: embeddings)")
        ] = False,
        preferences_only: Annotated[
            bool,
            typer.Option(
                "--preferences-only",
                help="Pin only stated preferences (extractor generic_facts=False; not shipped)",
            ),
        ] = False,
        store_url: Annotated[
            str | None, typer.Option("--store", help="Replay into this store URL (default: memory)")
        ] = None,
        plot: Annotated[
            Path | None, typer.Option("--plot", help="Also write a PNG of recall vs budget (extra: plot)")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Last line: the results as JSON")] = False,
    ) -> None:
        """Share of each question's evidence turns kept in the assembled context (cl100k)."""
        budgets = [int(b) for b in budget.split(",") if b.strip()]
        names = [s.strip() for s in strategy.split(",") if s.strip()]
        options = EvalOptions(
            preferences_only=preferences_only, embeddings=embeddings, store_url=store_url
        )
        result = evaluate_locomo(data, budgets, names, progress=True, options=options)
        _print_table(result)
        departures = result["departures"]
        print("departs from the shipped configuration: " + ("; ".join(departures) or "nothing"))
        if plot is not None:
            print(f"plot written to {plot_recall(result, plot)}")
        if as_json:
            print_json_line(result)
