"""`CallLog.between` looks only at the calls that asked since the start and those running then;
it answers as a scan of every kept call would, whatever calls start, end, fall out of the log
or are noted in between."""

from __future__ import annotations

import random
import time

import pytest

from contextmode.models.calls import CallLog, CallMeter


def _scan(log: CallLog, start: float, end: float) -> list[CallMeter]:
    """What `between` answered before: every kept call, looked at one by one."""
    return [m for m in log.calls if m.asked <= end and (m.ended is None or m.ended >= start)]


@pytest.mark.parametrize("seed", range(12))
def test_between_answers_as_a_scan_of_every_call(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    now = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    monkeypatch.setattr(CallLog, "KEEP", rng.choice([8, 32, 512]))
    log = CallLog()
    running: list[CallMeter] = []
    for _ in range(1500):
        now[0] += rng.choice([0.0, 0.001, 0.01, 0.5])
        action = rng.random()
        if action < 0.35:
            running.append(log.start())
        elif action < 0.65 and running:
            meter = running.pop(rng.randrange(len(running)))
            if rng.random() < 0.9:  # some never end (abandoned)
                meter.end("ok")
        elif action < 0.75:
            log.note("emotion", "s", "offline")
        else:
            start = now[0] - rng.choice([0.0, 0.01, 0.3, 2.0, 50.0])
            end = None if rng.random() < 0.7 else start + rng.choice([0.0, 0.2, 5.0])
            upto = now[0] if end is None else end
            assert log.between(start, end) == tuple(m.as_call(start) for m in _scan(log, start, upto))
