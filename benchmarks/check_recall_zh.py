"""A small Chinese long-conversation recall check, built from the CPED dev file.

CPED (../shared/data/cped/valid_split.csv) holds Chinese TV dialogues. The
utterances of the TV series with the most of them are replayed, in order, as one
long conversation through the shipped engine (`build_engine`, default settings,
offline processors; the most talkative character is the user, everyone else the
assistant, names kept as ``speaker``). Then, for 60 utterances of 12+ characters
taken from the first 80 % of the conversation (seeded), a question is formed from
the speaker's name and the middle half of the utterance (a known-item probe: it
checks that Chinese analysis, ranking and the budget bring an old turn back; it
is not a paraphrase benchmark), asked at the end, and we count the share of
target turns present verbatim in the context (2,000 tokens of input, cl100k).

Run for the memory store and SQLite (the stored index): the two must agree.
Last line: JSON ``{"turns", "questions", "found": {store: share}}``.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import random
import tempfile
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Literal

from contextmode.api import build_engine
from contextmode.models.offline import OfflineResponder
from contextmode.settings import EngineSettings
from contextmode.store import open_store
from contextmode.tokens import counter_for_encoding
from contextmode.types import SessionKey

DATA = os.environ.get("CPED_FILE", "../shared/data/cped/valid_split.csv")
QUESTIONS = 60
_VERBATIM = ("recent", "key_moments", "recall")


def _conversation() -> list[tuple[str, str]]:
    with open(DATA, encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    by_tv = Counter(r["TV_ID"] for r in rows)
    tv = by_tv.most_common(1)[0][0]
    return [(r["Speaker"], r["Utterance"].strip()) for r in rows if r["TV_ID"] == tv and r["Utterance"].strip()]


async def _run(url: str, lines: list[tuple[str, str]], probes: list[tuple[int, str]]) -> float:
    counter = counter_for_encoding("cl100k_base")
    engine = build_engine(store=open_store(url), model=OfflineResponder(), counter=counter,
                          settings=EngineSettings(), processors="offline")
    user = Counter(s for s, _ in lines).most_common(1)[0][0]
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    try:
        for i, (speaker, text) in enumerate(lines):
            role: Literal["user", "assistant"] = "user" if speaker == user else "assistant"
            await engine.record("zh", "cped", role, text, metadata={"speaker": speaker},
                                created_at=t0 + timedelta(minutes=i))
            if role == "user":
                await engine.drain()
        await engine.drain()
        engine.settings = replace(engine.settings, context_window=2000, reply_reserve=0)
        found = 0
        for seq, question in probes:
            ctx = (await engine.prepare("zh", "cped", question)).context
            shown = {item.seq for layer in ctx.layers if layer.name in _VERBATIM for item in layer.items}
            found += seq in shown
        return round(found / len(probes), 3)
    finally:
        await engine.store.delete(SessionKey("zh", "cped"))
        await engine.close()


def main() -> None:
    lines = _conversation()
    rng = random.Random(16)
    eligible = [i for i, (_, text) in enumerate(lines[: int(len(lines) * 0.8)]) if len(text) >= 12]
    probes = []
    for i in rng.sample(eligible, min(QUESTIONS, len(eligible))):
        speaker, text = lines[i]
        quarter = len(text) // 4
        probes.append((i + 1, f"{speaker}说过“{text[quarter : len(text) - quarter]}”是什么时候？"))
    folder = tempfile.mkdtemp(prefix="zh-recall-")
    found = {
        "memory": asyncio.run(_run("memory://", lines, probes)),
        "sqlite": asyncio.run(_run(f"sqlite:///{folder}/zh.db", lines, probes)),
    }
    print(f"{len(lines)} Chinese turns, {len(probes)} probes: found {found}")
    print(json.dumps({"turns": len(lines), "questions": len(probes), "found": found}, ensure_ascii=False))


if __name__ == "__main__":
    main()
