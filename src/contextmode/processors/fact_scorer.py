"""English self-disclosure clause scorer of the offline constraint extractor.

A user turn is cut into clauses (sentences, then commas and conjunctions); each clause is
cleaned (leading fillers such as "well, yeah, lol" dropped, trailing punctuation trimmed)
and scored by a small logistic regression over surface features: its words, its first
one to three words ("I have", "my wife is"), first/second person, question, length,
position in the turn. The best ``max_facts`` clauses whose probability reaches the
model's ``threshold`` become first-person facts.

The weights are a JSON file shipped beside the package (``data/fact_scorer_en.json``),
produced by ``scripts/train_fact_classifier.py`` from Multi-Session Chat persona
annotations; inference is pure Python (a dict lookup per feature and one exponential).

`fact_words` is the shared word normaliser: lower case, English stop words and fillers
dropped, irregular forms mapped to a base form (grew → grow, kids → kid), then the same
crude suffix stripping as `contextmode.processors.constraints.content_words`. The MSC
matching rule of `contextmode.evaluation.constraints` uses it too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ._hashed_model import logistic
from .lexicons.constraint_patterns import EN_STOPWORDS

__all__ = [
    "Clause",
    "FactScorer",
    "candidates",
    "clause_features",
    "default_scorer",
    "fact_words",
    "split_clauses",
    "stem_word",
]

FORMAT = "contextmode-fact-scorer/1"
MODEL_FILE = "fact_scorer_en.json"

_IRREGULAR_TEXT = """
grew:grow grown:grow went:go gone:go got:get gotten:get had:have has:have made:make
ran:run bought:buy took:take taken:take kids:kid children:child wrote:write written:write
ate:eat eaten:eat drove:drive driven:drive rode:ride sang:sing saw:see seen:see
began:begin taught:teach thought:think brought:bring caught:catch felt:feel kept:keep
left:leave lost:lose met:meet paid:pay sold:sell spent:spend won:win built:build
born:bear fell:fall flew:fly knew:know swam:swim told:tell wore:wear men:man women:woman
mice:mouse feet:foot teeth:tooth people:person moms:mom mum:mom favourite:favorite
colour:color
"""
_IRREGULAR = dict(pair.split(":") for pair in _IRREGULAR_TEXT.split())
_FILLERS_TEXT = """lol haha hahaha lmao omg wow um umm hmm oh ah ok okay yes yeah yep nope no hey hi
hello well sure thanks thank awesome cool nice great"""
_FILLERS = frozenset(_FILLERS_TEXT.split())


def stem_word(word: str) -> str:
    """Crude English suffix stripping (lives, live → liv); also behind `constraints.content_words`."""
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith(("sses", "shes", "ches", "xes")):
        word = word[:-2]
    else:
        for suffix in ("ing", "ed", "s"):
            if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
                word = word[: -len(suffix)]
                break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


_NUMBER_TEXT = "zero one two three four five six seven eight nine ten eleven twelve"
_NUMBERS = {w: str(i) for i, w in enumerate(_NUMBER_TEXT.split())}
_STOP_STEMS = frozenset(stem_word(w) for w in EN_STOPWORDS | _FILLERS)
_TOKEN = re.compile(r"[a-z0-9]+(?:['’][a-z]+)?|[\u4e00-\u9fff]")


def fact_words(text: str) -> list[str]:
    """Lemmatised content words of ``text`` (stop words and fillers dropped; CJK by character)."""
    out = []
    for raw in _TOKEN.findall(text.lower()):
        token = raw.replace("’", "").replace("'", "")
        token = _NUMBERS.get(raw, _IRREGULAR.get(token, token))
        if token in EN_STOPWORDS or token in _FILLERS:
            continue
        stem = stem_word(token)
        if stem not in _STOP_STEMS:
            out.append(stem)
    return out


@dataclass(frozen=True, kw_only=True)
class Clause:
    """One cleaned clause of a turn; ``question`` when its sentence asks something."""

    text: str
    index: int
    count: int
    question: bool


_SENTENCE = re.compile(r"(?<=[.!?;:])\s+|\n+|\.{2,}\s*")
_CLAUSE = re.compile(
    r"\s*,\s*|\s+(?:but|because|and|so|though|although|since|which|while|when|if|cause|cuz)\s+"
    r"|\s+-+\s+|\s*[()]\s*",
    re.IGNORECASE,
)
_LEAD = re.compile(
    r"^(?:(?:lol|haha+|oh|ah|well|yeah|yes|yep|no|nope|so|but|and|also|wow|ok|okay|um+|hmm+|"
    r"hey|hi|hello|actually|honestly)\b[\s,!.]*)+",
    re.IGNORECASE,
)


def split_clauses(text: str) -> list[Clause]:
    """Cleaned clauses of ``text`` holding at least one content word, in order."""
    found: list[tuple[str, bool]] = []
    for sentence in _SENTENCE.split(text):
        sentence = sentence.strip()
        if not sentence:
            continue
        question = sentence.rstrip(" .!~)\"'").endswith("?")
        for part in _CLAUSE.split(sentence):
            cleaned = _LEAD.sub("", part.strip()).strip(" .!?,;:-\"'~*")
            if cleaned and fact_words(cleaned):
                found.append((cleaned, question))
    return [Clause(text=t, index=i, count=len(found), question=q) for i, (t, q) in enumerate(found)]


_QUESTION_START = re.compile(
    r"^(?:do|does|did|are|is|was|were|have|has|can|could|would|will|what|where|when|who|why|"
    r"how|which|should|any|anything)\b",
    re.IGNORECASE,
)
_FIRST_PERSON = re.compile(r"\b(?:i|i'm|im|i've|ive|i'd|i'll|my|me|mine|myself|we|our|us)\b")
_SECOND_PERSON = re.compile(r"\b(?:you|your|you're|youre|yours)\b")
_NUMBER = re.compile(r"\d|\b(?:one|two|three|four|five|six|seven|eight|nine|ten)\b")
_PROPER = re.compile(r"\s[A-Z][a-z]")


def clause_features(clause: Clause) -> dict[str, float]:
    """Sparse features of one clause (names → values); the training script uses the same."""
    lowered = clause.text.lower().replace("’", "'")
    tokens = [_IRREGULAR.get(t, t) for t in re.findall(r"[a-z0-9']+", lowered)]
    features: dict[str, float] = {f"w={stem_word(t.replace(chr(39), ''))}": 1.0 for t in tokens}
    if tokens:
        features["s0=" + tokens[0]] = 1.0
    if len(tokens) > 1:
        features["s01=" + "_".join(tokens[:2])] = 1.0
    if len(tokens) > 2:
        features["s012=" + "_".join(tokens[:3])] = 1.0
    features[f"nc={min(len(fact_words(clause.text)), 9)}"] = 1.0
    features["fp"] = 1.0 if _FIRST_PERSON.search(lowered) else 0.0
    features["you"] = float(len(_SECOND_PERSON.findall(lowered)))
    features["q"] = 1.0 if clause.question or _QUESTION_START.match(clause.text) else 0.0
    features["pos0"] = 1.0 if clause.index == 0 else 0.0
    features["poslast"] = 1.0 if clause.index == clause.count - 1 else 0.0
    features[f"n={min(clause.count, 8)}"] = 1.0
    features["digit"] = 1.0 if _NUMBER.search(lowered) else 0.0
    features["cap"] = 1.0 if _PROPER.search(clause.text) else 0.0
    return features


_VAGUE_END = re.compile(r"\b(?:it|them|that|this|those|these|him|her|one|there|so|too)\s*$",
                        re.IGNORECASE)


def candidates(text: str, min_words: int = 1) -> list[Clause]:
    """Clauses of ``text`` that can be facts: ``min_words`` distinct content words, not
    ending on a bare pronoun ("I love it" says nothing on its own)."""
    return [
        clause for clause in split_clauses(text)
        if len(set(fact_words(clause.text))) >= min_words and not _VAGUE_END.search(clause.text)
    ]


class FactScorer:
    """Logistic regression over `clause_features`: ``weights`` by feature name, ``bias``;
    ``threshold`` is the probability a clause needs, ``max_facts`` the clauses kept a turn."""

    def __init__(
        self, *, weights: dict[str, float], bias: float, threshold: float = 0.5,
        max_facts: int = 2, min_words: int = 1,
    ) -> None:
        self.weights = weights
        self.bias = bias
        self.threshold = threshold
        self.max_facts = max_facts
        self.min_words = min_words

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FactScorer:
        """A scorer from the JSON written by ``scripts/train_fact_classifier.py``."""
        if data.get("format") != FORMAT:
            raise ConfigError(f"not a {FORMAT} model: format {data.get('format')!r}")
        try:
            return cls(
                weights={k: float(v) for k, v in data["weights"].items()},
                bias=float(data["bias"]), threshold=float(data["threshold"]),
                max_facts=int(data["max_facts"]), min_words=int(data.get("min_words", 1)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"malformed {FORMAT} model: {exc}") from exc

    @classmethod
    def load(cls, path: str | Path) -> FactScorer:
        """A scorer from a model file on disk."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def probability(self, clause: Clause) -> float:
        """Probability (0–1) that ``clause`` states a fact about the speaker."""
        return logistic(self.bias + sum(
            self.weights.get(name, 0.0) * value for name, value in clause_features(clause).items()
        ))

    def select(self, text: str, max_facts: int | None = None) -> list[tuple[Clause, float]]:
        """The best clauses of ``text`` at or above the threshold, in turn order."""
        limit = self.max_facts if max_facts is None else min(max_facts, self.max_facts)
        scored = [
            (clause, self.probability(clause)) for clause in candidates(text, self.min_words)
        ]
        best = sorted(scored, key=lambda item: -item[1])[:limit]
        return sorted((item for item in best if item[1] >= self.threshold),
                      key=lambda item: item[0].index)


@cache
def default_scorer() -> FactScorer | None:
    """The shipped model, or None when the package was installed without its data file."""
    try:
        text = resources.files("contextmode.processors").joinpath("data", MODEL_FILE).read_text(
            encoding="utf-8"
        )
    except (FileNotFoundError, OSError):
        return None
    return FactScorer.from_dict(json.loads(text))
