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
  adversarial left out) found verbatim (case-insensitive) in the last summary;
* ``whole_clause_share``: share of summary items (each sentence of a summary line, each
  item of the facts line) that are a whole sentence or clause of the conversation: found
  verbatim in one turn, starting and ending at a clause boundary. Facts-line items that are
  a bare fact (a number or a name, when its clause is too long) are counted apart in
  ``bare_fact_items`` and left out of the share;
* ``observation_coverage``: share of LoCoMo's gold session observations (both speakers)
  whose content words are at least half present in the summary right after that session.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from ..processors.audit import collect_facts, fact_kept, restore_facts, split_facts_line
from ..processors.constraints import content_words
from ..processors.summarize import DEFAULT_BLOCK_CHARS, OfflineSummarizer
from ..text import detect_language
from ..types import Turn
from .report import JsonFlag, print_figures, print_json_line, progress_steps

__all__ = ["evaluate_summary", "is_whole_clause", "register", "summary_items"]


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


_EMOTION_MARK = re.compile(r"（情绪强度\d/5）| ?\(emotion \d/5\)")
_BOUNDARY = set(" \t\n，。！？；：,;:!?.…~、\"'“”（）()[]【】")
_ZH_SUMMARY_SENTENCE = re.compile(r"[^。！？!?；;]+[。！？!?；;]*")
_EN_SUMMARY_SENTENCE = re.compile(r"[^.!?]+(?:[.!?]+|$)")
_CJK = re.compile(r"[\u4e00-\u9fff]")


def summary_items(text: str) -> tuple[list[str], list[str]]:
    """``(sentences of the summary lines, items of the facts line)``, labels and emotion marks removed."""
    body, facts = split_facts_line(text)
    sentences: list[str] = []
    for line in body.splitlines():
        line = _EMOTION_MARK.sub("", line.split(": ", 1)[-1]).strip()
        pattern = _ZH_SUMMARY_SENTENCE if _CJK.search(line) else _EN_SUMMARY_SENTENCE
        for piece in pattern.findall(line):
            piece = piece.strip()
            if piece:
                sentences.append(piece)
    return sentences, [_EMOTION_MARK.sub("", f).strip() for f in facts if f.strip()]


def is_whole_clause(item: str, sources: Sequence[str]) -> bool:
    """``item`` occurs in one of ``sources`` starting and ending at a clause boundary."""
    core = item.strip().rstrip("，。！？；,;!?.")
    if not core:
        return False
    for source in sources:
        start = source.find(core)
        while start >= 0:
            end = start + len(core)
            left = start == 0 or source[start - 1] in _BOUNDARY
            right = end == len(source) or source[end] in _BOUNDARY
            if left and right:
                return True
            start = source.find(core, start + 1)
    return False


def _observations(sample: dict[str, Any], session_key: str) -> list[str]:
    by_speaker = (sample.get("observation") or {}).get(f"{session_key}_observation") or {}
    return [str(item[0]) for items in by_speaker.values() for item in items if item]


def _covered(observation: str, summary_words: set[str]) -> bool:
    words = set(content_words(observation))
    return bool(words) and len(words & summary_words) / len(words) >= 0.5


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
    run = _Run(
        plain=OfflineSummarizer(block_chars=block_chars, max_chars=max_chars, audit=False),
        audited=OfflineSummarizer(block_chars=block_chars, max_chars=max_chars, max_restored=max_restored),
        max_restored=max_restored,
        block_chars=block_chars,
    )
    steps_total = sum(len(_sessions(s["conversation"])) for s in samples)
    with progress_steps("summarising sessions", steps_total, show_progress) as step:
        for sample in samples:
            run.sample(sample, step)
    return run.figures(len(samples))


@dataclass
class _Run:
    """One evaluation: the two summarisers and the counts so far."""

    plain: OfflineSummarizer
    audited: OfflineSummarizer
    max_restored: int
    block_chars: int | None
    totals: dict[str, int] = field(default_factory=lambda: {
        "facts": 0, "before": 0, "after": 0, "lead": 0, "restored": 0, "steps": 0,
        "items": 0, "whole": 0, "bare": 0, "observations": 0, "observed": 0,
    })
    final: dict[str, int] = field(default_factory=lambda: {
        "facts": 0, "audited": 0, "plain": 0, "qa": 0, "qa_audited": 0, "qa_plain": 0,
    })
    summary_chars: list[int] = field(default_factory=list)

    def sample(self, sample: dict[str, Any], step: Callable[[], None]) -> None:
        """Summarise one conversation session by session, then score the final summaries."""
        conv = sample["conversation"]
        text_audited: str | None = None
        text_plain: str | None = None
        seen_turns: list[Turn] = []
        for session_key, session in _sessions(conv):
            turns = _turns(session, conv.get("speaker_a", ""), len(seen_turns) + 1)
            seen_turns.extend(turns)
            self._step(text_audited, turns)
            text_audited = self.audited.summarize_text(text_audited, turns).text
            text_plain = self.plain.summarize_text(text_plain, turns).text
            _score_items(self.totals, text_audited, seen_turns, _observations(sample, session_key))
            step()
        self._final(sample, seen_turns, text_audited or "", text_plain or "")

    def _step(self, previous: str | None, turns: Sequence[Turn]) -> None:
        """Facts of one session kept by the plain step, after the audit, and by the lead baseline."""
        totals = self.totals
        language = detect_language(" ".join(t.content for t in turns))
        before = self.plain.summarize_text(previous, turns).text
        after = restore_facts(before, turns, max_restored=self.max_restored)
        facts = collect_facts(turns, language)
        lead = _lead(turns, self.block_chars or DEFAULT_BLOCK_CHARS[language])
        totals["facts"] += len(facts)
        totals["before"] += sum(fact_kept(f, before) for f in facts)
        totals["after"] += sum(fact_kept(f, after.text) for f in facts)
        totals["lead"] += sum(fact_kept(f, lead) for f in facts)
        totals["restored"] += len(after.restored_facts)
        totals["steps"] += 1

    def _final(self, sample: dict[str, Any], seen_turns: Sequence[Turn], text_audited: str, text_plain: str) -> None:
        """The whole conversation's facts and short QA answers found in the final summaries."""
        final = self.final
        language = detect_language(" ".join(t.content for t in seen_turns))
        all_facts = collect_facts(seen_turns, language)
        final["facts"] += len(all_facts)
        final["audited"] += sum(fact_kept(f, text_audited) for f in all_facts)
        final["plain"] += sum(fact_kept(f, text_plain) for f in all_facts)
        self.summary_chars.append(len(text_audited))
        for qa in sample.get("qa", []):
            answer = str(qa.get("answer", "")).strip().lower()
            if qa.get("category") == 5 or not answer or len(answer) > 30:
                continue
            final["qa"] += 1
            final["qa_audited"] += answer in text_audited.lower()
            final["qa_plain"] += answer in text_plain.lower()

    def figures(self, conversations: int) -> dict[str, Any]:
        totals, final, summary_chars = self.totals, self.final, self.summary_chars
        return {
            "whole_clause_share": _share(totals["whole"], totals["items"]),
            "observation_coverage": _share(totals["observed"], totals["observations"]),
            "in_sample": False,
            "kept_before": _share(totals["before"], totals["facts"]),
            "kept_after": _share(totals["after"], totals["facts"]),
            "baseline_lead_kept": _share(totals["lead"], totals["facts"]),
            "final_kept_audited": _share(final["audited"], final["facts"]),
            "final_kept_plain": _share(final["plain"], final["facts"]),
            "qa_answer_in_summary_audited": _share(final["qa_audited"], final["qa"]),
            "qa_answer_in_summary_plain": _share(final["qa_plain"], final["qa"]),
            "conversations": conversations,
            "steps": totals["steps"],
            "facts_per_step": round(totals["facts"] / totals["steps"], 2) if totals["steps"] else 0,
            "restored_per_step": round(totals["restored"] / totals["steps"], 2)
            if totals["steps"] else 0,
            "qa_items": final["qa"],
            "summary_items": totals["items"],
            "bare_fact_items": totals["bare"],
            "observations": totals["observations"],
            "final_summary_chars_mean": round(sum(summary_chars) / len(summary_chars), 1)
            if summary_chars else 0,
        }


def _score_items(
    totals: dict[str, int], summary: str, turns: Sequence[Turn], observations: Sequence[str]
) -> None:
    """Count the summary's items, those that are whole clauses of ``turns``, and the gold
    ``observations`` it covers."""
    summary_words = set(content_words(summary))
    totals["observations"] += len(observations)
    totals["observed"] += sum(_covered(o, summary_words) for o in observations)
    sources = [t.content for t in turns]
    sentences, facts = summary_items(summary)
    for item in sentences:
        totals["items"] += 1
        totals["whole"] += is_whole_clause(item, sources)
    for item in facts:
        if is_whole_clause(item, sources):
            totals["items"] += 1
            totals["whole"] += 1
        elif not any(ch in item for ch in " ，,；;。.") and len(item) <= 24:
            totals["bare"] += 1  # a bare number or name, not a clause
        else:
            totals["items"] += 1


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
