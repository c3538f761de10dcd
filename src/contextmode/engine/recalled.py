"""Why each older turn is in the context: recall's reasons and key moments (`explain_recalled`).

Apart from `engine.trace` so that `PreparedTurn` (which keeps the answer) imports it without
importing the trace builder back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..memory import recall as recall_module
from ..store.records import RecalledTurn

if TYPE_CHECKING:
    from ..assembly.context import Context
    from ..processors.base import Rewrite
    from ..types import SessionState

__all__ = ["explain_recalled"]


def explain_recalled(
    context: Context, rewrite: Rewrite | None, state: SessionState
) -> tuple[RecalledTurn, ...]:
    """The older turns ``context`` holds (recall and key-moment layers), each with why:
    for recall the score, ranker and matched query terms (`memory.recall.explain_recall`
    on the query recall was given), for a key moment its emotion intensity.
    `PreparedTurn.recalled_turns` keeps the answer."""
    query = rewrite.text if rewrite is not None and rewrite.changed and rewrite.verified else context.message
    recall = context.layer("recall")
    shown = {item.seq for item in recall.items} if recall is not None else set()
    reasons = {
        r.seq: r
        for r in recall_module.explain_recall(query, state.turns, [t for t in state.recalled if t.seq in shown])
    }
    emotions = {t.seq: t.emotion for t in state.key_moments}
    recalled: list[RecalledTurn] = []
    for name in ("recall", "key_moments"):
        layer = context.layer(name)
        for rank, item in enumerate(layer.items if layer else (), start=1):
            if item.seq is None:
                continue
            if name == "recall":
                reason = reasons.get(item.seq)
                recalled.append(RecalledTurn(
                    seq=item.seq, layer=name, why=f"relevant to the message (rank {rank})", text=item.text,
                    score=reason.score if reason else None, matched=reason.matched if reason else (),
                    neighbour_of=reason.neighbour_of if reason else None, ranker=reason.ranker if reason else "",
                ))
            else:
                recalled.append(RecalledTurn(seq=item.seq, layer=name, why="emotional key moment",
                                             text=item.text, score=emotions.get(item.seq)))
    return tuple(recalled)
