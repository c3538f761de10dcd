"""Emotion scoring time per turn, as the engine scores it (with the turns before as context).

    python benchmarks/bench_emotion.py [--turns 2000] [--cped FILE] [--esconv FILE]

Built-in Chinese and English conversations are scored turn by turn through
`OfflineEmotionScorer.score_sync` with the turns before as context (their own
logits are cached, as in a live session where each was scored when it arrived). With
``--cped`` / ``--esconv`` the turns come from those dev files instead. Reported: median
(p50) and p95 milliseconds per turn, per language. Goal: p50 ≤ 0.2 ms. The last line
printed is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from contextmode.evaluation.emotion_data import read_cped, read_esconv
from contextmode.processors.base import PriorTurn
from contextmode.processors.emotion import OfflineEmotionScorer
from contextmode.processors.emotion_model import CONTEXT_WINDOW

_ZH = [
    "怎么了", "你今天怎么这么晚才回来", "别提了，公司又加班，我真的快崩溃了！",
    "老板又骂你了？", "他当着所有人的面说我的方案是垃圾", "太过分了吧，这也太不尊重人了",
    "我现在一点都不想干了", "先别冲动，我们明天再想办法", "好吧，谢谢你一直陪着我",
    "晚饭想吃什么", "随便吧，我没什么胃口", "那我给你煮碗面",
]
_EN = [
    "Hi", "I had problems in the past and somehow right now", "What happened?",
    "I lost my job last month and I feel so anxious about everything",
    "That sounds really hard.", "I can't sleep, I keep worrying about money!!",
    "Have you talked to anyone about it?", "Not really, my family doesn't understand",
    "I'm so tired of pretending everything is fine", "Thank you for listening",
    "What do you usually do on weekends?", "I walk my dog in the park",
]


def _conversations(args: argparse.Namespace) -> dict[str, list[list[tuple[str, str]]]]:
    out: dict[str, list[list[tuple[str, str]]]] = {"zh": [], "en": []}
    if args.cped:
        dialogues: dict[str, list[tuple[str, str]]] = {}
        for row in read_cped(args.cped):
            dialogues.setdefault(row.dialogue, []).append((row.speaker, row.text))
        out["zh"] = list(dialogues.values())
    else:
        out["zh"] = [[("ab"[i % 2], t) for i, t in enumerate(_ZH)]]
    if args.esconv:
        out["en"] = [list(c.turns) for c in read_esconv(args.esconv)]
    else:
        out["en"] = [[("ab"[i % 2], t) for i, t in enumerate(_EN)]]
    return out


def _time(scorer: OfflineEmotionScorer, conversations: list[list[tuple[str, str]]], n: int,
          start_round: int = 0) -> list[float]:
    times: list[float] = []
    rounds = start_round
    while len(times) < n:
        rounds += 1
        for conv in conversations:
            if rounds > 1:
                # Each pass scores new text (a number appended), so nothing is a cache hit.
                conv = [(speaker, f"{text} {rounds}") for speaker, text in conv]
            for i, (speaker, text) in enumerate(conv):
                prior = [PriorTurn(text=t, same_speaker=s == speaker) for s, t in conv[max(0, i - CONTEXT_WINDOW):i]]
                start = time.perf_counter()
                scorer.score_sync(text, prior)
                times.append((time.perf_counter() - start) * 1000)
                if len(times) >= n:
                    return times
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--cped", type=Path)
    parser.add_argument("--esconv", type=Path)
    args = parser.parse_args(argv)
    scorer = OfflineEmotionScorer()
    result: dict[str, object] = {"goal_p50_ms": 0.2}
    for language, conversations in _conversations(args).items():
        _time(scorer, conversations, 200, start_round=10**6)  # warm: model, jieba, VADER
        times = sorted(_time(scorer, conversations, args.turns))
        p50 = statistics.median(times)
        p95 = times[int(len(times) * 0.95) - 1]
        print(f"{language}: p50 {p50:.4f} ms  p95 {p95:.4f} ms  ({len(times)} turns)")
        result[f"p50_ms_{language}"] = round(p50, 4)
        result[f"p95_ms_{language}"] = round(p95, 4)
    result["load_average_1m"] = round(os.getloadavg()[0], 2)
    result["met"] = all(float(str(result[f"p50_ms_{lang}"])) <= 0.2 for lang in ("zh", "en"))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
