"""Incremental summary and its audit on LoCoMo-style long conversations.

Input: a JSON list of ``{sample_id, conversation:{speaker_a, speaker_b,
session_N_date_time, session_N:[{speaker, dia_id, text}]}, qa:[{question, answer,
category}]}`` (LoCoMo). Each conversation is summarised session by session with
`OfflineSummarizer` (``speaker_a`` plays the user). A ``.csv`` file in CPED's format
(``Dialogue_ID, Speaker, Utterance``) works too, for Chinese: each dialogue is a
conversation, its first speaker the user, and every ``chunk`` utterances a session. At every step the facts of the
session's turns (numbers with units, named entities, the user's stated constraints — see
`contextmode.processors.audit.collect_facts`) are counted and looked up:

* ``kept_before``: share of the step's facts still in the summary before the audit;
* ``kept_after``: the same after the audit restored what it could (``max_restored`` per step);
* ``baseline_lead_kept``: the first ``block_chars`` characters of the session, unscored;
* ``final_kept_*``: share of all the conversation's facts still in the last summary, for a
  chain with the audit and one without (long-term retention under the length bound);
* ``qa_answer_in_summary_*``: share of short QA answers (≤ 30 characters, category 5
  adversarial left out) found verbatim (case-insensitive) in the last summary.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from ..processors.audit import collect_facts, fact_kept, restore_facts
from ..processors.lexicons import detect_language
from ..processors.summarize import DEFAULT_BLOCK_CHARS, OfflineSummarizer
from ..types import Turn
from .report import JsonFlag, print_figures, print_json_line, progress_steps

__all__ = ["evaluate_summary", "register"]


def _sessions(conversation: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    keys = [k for k in conversation if re.fullmatch(r"session_\d+", k)]
    keys.sort(key=lambda k: int(k.split("_")[1]))
    return [(k, conversation[k]) for k in keys if conversation[k]]


def _turns(session: list[dict[str, Any]], user: str, start_seq: int) -> list[Turn]:
    now = datetime.now(UTC)
    return [
        Turn(
            seq=start_seq + i,
            role="user" if item.get("speaker") == user else "assistant",
            content=item.get("text", ""),
            tokens=0,
            created_at=now,
            metadata={"speaker": item.get("speaker", "")},
        )
        for i, item in enumerate(session)
    ]


def _read_cped(path: Path, chunk: int) -> list[dict[str, Any]]:
    """CPED rows grouped into LoCoMo-shaped samples (no QA)."""
    dialogues: dict[str, list[dict[str, str]]] = {}
    with path.open(encoding="utf-8-sig", newline="") as fh:
        for row in csv.DictReader(fh):
            dialogues.setdefault(row["Dialogue_ID"], []).append(row)
    samples = []
    for dialogue_id, rows in dialogues.items():
        conversation: dict[str, Any] = {"speaker_a": rows[0]["Speaker"]}
        for n, start in enumerate(range(0, len(rows), chunk), 1):
            conversation[f"session_{n}"] = [
                {"speaker": r["Speaker"], "dia_id": f"D{n}:{i}", "text": r["Utterance"]}
                for i, r in enumerate(rows[start : start + chunk], 1)
            ]
        samples.append({"sample_id": dialogue_id, "conversation": conversation, "qa": []})
    return samples


def _load(path: Path, chunk: int) -> list[dict[str, Any]]:
    if path.suffix.lower() == ".csv":
        return _read_cped(path, chunk)
    data: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _share(kept: int, total: int) -> float:
    return round(kept / total, 4) if total else 0.0


def _lead(turns: Sequence[Turn], chars: int) -> str:
    text = "\n".join(f"{t.metadata.get('speaker', t.role)}: {t.content}" for t in turns)
    return text[:chars]


def evaluate_summary(
    path: str | Path,
    *,
    block_chars: int | None = None,
    max_chars: int | None = None,
    max_restored: int = 12,
    chunk: int = 8,
    limit: int | None = None,
    show_progress: bool = False,
) -> dict[str, Any]:
    """Fact retention of the offline summariser and its audit; see the module docstring.

    ``chunk``: utterances per session for a CPED ``.csv`` input (ignored for LoCoMo).
    """
    samples = _load(Path(path), chunk)[:limit]
    plain = OfflineSummarizer(block_chars=block_chars, max_chars=max_chars, audit=False)
    audited = OfflineSummarizer(
        block_chars=block_chars, max_chars=max_chars, max_restored=max_restored
    )
    totals = {"facts": 0, "before": 0, "after": 0, "lead": 0, "restored": 0, "steps": 0}
    final = {"facts": 0, "audited": 0, "plain": 0, "qa": 0, "qa_audited": 0, "qa_plain": 0}
    summary_chars: list[int] = []
    steps_total = sum(len(_sessions(s["conversation"])) for s in samples)
    with progress_steps("summarising sessions", steps_total, show_progress) as step:
        for sample in samples:
            conv = sample["conversation"]
            text_audited: str | None = None
            text_plain: str | None = None
            seen_turns: list[Turn] = []
            for _, session in _sessions(conv):
                turns = _turns(session, conv.get("speaker_a", ""), len(seen_turns) + 1)
                seen_turns.extend(turns)
                language = detect_language(" ".join(t.content for t in turns))
                before = plain.summarize_text(text_audited, turns).text
                after = restore_facts(before, turns, max_restored=max_restored)
                facts = collect_facts(turns, language)
                lead = _lead(turns, block_chars or DEFAULT_BLOCK_CHARS[language])
                totals["facts"] += len(facts)
                totals["before"] += sum(fact_kept(f, before) for f in facts)
                totals["after"] += sum(fact_kept(f, after.text) for f in facts)
                totals["lead"] += sum(fact_kept(f, lead) for f in facts)
                totals["restored"] += len(after.restored_facts)
                totals["steps"] += 1
                text_audited = audited.summarize_text(text_audited, turns).text
                text_plain = plain.summarize_text(text_plain, turns).text
                step()
            language = detect_language(" ".join(t.content for t in seen_turns))
            all_facts = collect_facts(seen_turns, language)
            final["facts"] += len(all_facts)
            final["audited"] += sum(fact_kept(f, text_audited or "") for f in all_facts)
            final["plain"] += sum(fact_kept(f, text_plain or "") for f in all_facts)
            summary_chars.append(len(text_audited or ""))
            for qa in sample.get("qa", []):
                answer = str(qa.get("answer", "")).strip().lower()
                if qa.get("category") == 5 or not answer or len(answer) > 30:
                    continue
                final["qa"] += 1
                final["qa_audited"] += answer in (text_audited or "").lower()
                final["qa_plain"] += answer in (text_plain or "").lower()
    return {
        "kept_before": _share(totals["before"], totals["facts"]),
        "kept_after": _share(totals["after"], totals["facts"]),
        "baseline_lead_kept": _share(totals["lead"], totals["facts"]),
        "final_kept_audited": _share(final["audited"], final["facts"]),
        "final_kept_plain": _share(final["plain"], final["facts"]),
        "qa_answer_in_summary_audited": _share(final["qa_audited"], final["qa"]),
        "qa_answer_in_summary_plain": _share(final["qa_plain"], final["qa"]),
        "conversations": len(samples),
        "steps": totals["steps"],
        "facts_per_step": round(totals["facts"] / totals["steps"], 2) if totals["steps"] else 0,
        "restored_per_step": round(totals["restored"] / totals["steps"], 2)
        if totals["steps"] else 0,
        "qa_items": final["qa"],
        "final_summary_chars_mean": round(sum(summary_chars) / len(summary_chars), 1)
        if summary_chars else 0,
    }


def register(app: typer.Typer) -> None:
    """Add the ``summary`` evaluation subcommand to ``app``."""

    @app.command("summary")
    def summary_command(
        data: Annotated[Path, typer.Option("--data", help="LoCoMo JSON or CPED .csv file")],
        block_chars: Annotated[int | None, typer.Option(help="New characters per step")] = None,
        max_chars: Annotated[int | None, typer.Option(help="Summary length bound, characters")] = None,
        max_restored: Annotated[int, typer.Option(help="Facts the audit may add per step")] = 12,
        chunk: Annotated[int, typer.Option(help="CPED .csv: utterances per session")] = 8,
        limit: Annotated[int | None, typer.Option(help="Only the first N conversations")] = None,
        as_json: JsonFlag = False,
    ) -> None:
        """Facts kept by the incremental summary before and after the audit."""
        result = evaluate_summary(
            data, block_chars=block_chars, max_chars=max_chars, max_restored=max_restored,
            chunk=chunk, limit=limit, show_progress=True,
        )
        print_figures("incremental summary + audit (LoCoMo)", result)
        if as_json:
            print_json_line(result)
