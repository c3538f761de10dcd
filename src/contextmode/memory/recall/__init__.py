"""Recall: the older turns that matter to the current message.

- `text`: index terms of a text (jieba search-mode words and bigrams, light English stemming);
- `index`: the in-process incremental BM25 index;
- `stored`: BM25 over postings a store keeps (only the query terms' postings are read);
- `semantic`: query expansion by meaning, from a static thesaurus distilled from MiniLM (numpy only);
- `dense`: optional embeddings (MiniLM, or any OpenAI ``/v1/embeddings`` server) fused with BM25;
- `recaller`: the `Recaller` the engine asks, which picks one of the above per session;
- `strategy`: the strategies with a recall layer (``default``, ``hybrid_recall``), registered
  by `register_recall_strategies` (called once, by `contextmode.memory`).
"""

from .recaller import (
    Recaller,
    RecallHit,
    RecallReason,
    RecallSettings,
    TurnSource,
    explain_recall,
    fetch_turns,
    recall_query,
)
from .strategy import DefaultStrategy, HybridRecall, register_recall_strategies

__all__ = [
    "DefaultStrategy",
    "HybridRecall",
    "RecallHit",
    "RecallReason",
    "RecallSettings",
    "Recaller",
    "TurnSource",
    "explain_recall",
    "fetch_turns",
    "recall_query",
    "register_recall_strategies",
]
