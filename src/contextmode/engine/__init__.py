"""The engine: one chat turn, end to end, one step per file.

| file          | step |
|---------------|------|
| `request.py`  | the turn's request (`TurnRequest`) and its events (`Prepared`, `Delta`, `Done`, `Failed`) |
| `prepare.py`  | load, detect, rewrite, recall, assemble (nothing written) |
| `stream.py`   | the streamed turn: store the user turn, stream the model, store the answer |
| `persist.py`  | storing turns, answers and traces |
| `schedule.py` | the background jobs a turn schedules (emotion, constraints, summary) |
| `seams.py`    | `Processors` and the recaller's Protocols |
| `core.py`     | `Engine`: the seams and the public methods |
"""

from .core import Engine
from .request import (
    USE_DEFAULT,
    Delta,
    Done,
    Failed,
    Prepared,
    PreparedTurn,
    ToolCallPart,
    TurnEvent,
    TurnRequest,
    TurnResult,
    Upstream,
    UseDefault,
)
from .seams import Processors, Recaller

__all__ = [
    "USE_DEFAULT",
    "Delta",
    "Done",
    "Engine",
    "Failed",
    "Prepared",
    "PreparedTurn",
    "Processors",
    "Recaller",
    "ToolCallPart",
    "TurnEvent",
    "TurnRequest",
    "TurnResult",
    "Upstream",
    "UseDefault",
]
