"""Offline constraint extraction: preferences, hard constraints, identity.

`OfflineConstraintExtractor` reads one user turn with hand-written Chinese and English
patterns and returns a `ConstraintUpdate`: typed `Constraint` entries (``key``, short
``value``, ``kind``, the turn's ``seq`` and the clause ``quote``) to pin, and keys the user
explicitly took back ("我现在能吃辣了", "I eat meat again now"). `apply_update` merges an
update into the pinned list: a newer value replaces the one with the same key in place,
retracted keys go.

Keys are normalised so a later statement finds the earlier one: fixed keys for one-valued
facts (``name``, ``age``, ``location``, ``job``, ``budget``, ``spice``, ``diet``) and
``like:<thing>`` / ``dislike:<thing>`` / ``allergy:<thing>`` / ``family:<who>`` /
``avoid:<thing>`` for facts that can hold several values. Everything else a user says about
themself in the first person ("I play guitar in a band") becomes a low-priority ``fact:…``
entry when ``generic_facts`` is on, since multi-session chat (MSC) shows most personal facts
take no fixed form. In English those untyped facts are the clauses the shipped
`FactScorer` (a small logistic regression, see `fact_scorer`) rates as self-disclosure,
rewritten in plain first-person form ("I'm" → "I am"); without the model file the older
first-person patterns are used.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Literal

from ..text.lang import detect_language
from ..types import Constraint, Turn
from .base import ConstraintUpdate, ModelFree
from .fact_scorer import FactScorer, default_scorer, stem_word
from .lexicons.constraint_patterns import (
    EN_STOPWORDS,
    Found,
    Retract,
    en_generic,
    en_rules,
    is_fact_head,
    normalise,
    zh_generic,
    zh_rules,
)

__all__ = [
    "OfflineConstraintExtractor",
    "apply_update",
    "canonical_fact",
    "content_words",
    "extract_constraints",
]

_MARKUP = re.compile(r"</?[A-Za-z][^<>]*>|</|/>|[<>]")
_ZH_SENTENCE = re.compile(r"(?<=[。！？!?；;\n，,])")
_ZH_OTHER_SUBJECT = re.compile(
    r"^\s*(?:我的?|他的?|她的?)?(?:朋友|老公|老婆|妻子|丈夫|男朋友|女朋友|对象|妈妈?|爸爸?|父母|孩子|儿子|女儿|"
    r"同事|室友|同学|家人|弟弟|哥哥|姐姐|妹妹|老板)|^\s*(?:他|她|别人|大家)"
)
_EN_SENTENCE = re.compile(r"(?<=[.!?;\n])\s+")
_EN_QUESTION_START = re.compile(
    r"^\s*(do|does|did|are|is|was|were|have|has|can|could|would|will|what|where|when|who|"
    r"why|how|which|should)\b",
    re.IGNORECASE,
)


def content_words(text: str) -> list[str]:
    """Lower-cased words of ``text`` minus English stop words, lightly stemmed; CJK by character."""
    words = []
    for raw in re.findall(r"[a-z0-9]+(?:['’][a-z]+)?|[\u4e00-\u9fff]", text.lower()):
        token = _NUMBER_WORDS.get(raw, raw.replace("'", "").replace("’", ""))
        stem = stem_word(token)
        if token in EN_STOPWORDS or stem in _STOP_STEMS:
            continue
        words.append(stem)
    return words


_NUMBER_TEXT = "zero one two three four five six seven eight nine ten eleven twelve"
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(_NUMBER_TEXT.split())}


_STOP_STEMS = frozenset(stem_word(w) for w in EN_STOPWORDS)


def _sentences(text: str, language: str) -> list[str]:
    parts = (_ZH_SENTENCE if language == "zh" else _EN_SENTENCE).split(text)
    return [p.strip() for p in parts if p and p.strip()]


def _is_question(sentence: str, language: str) -> bool:
    stripped = sentence.rstrip(" .!。！~")
    if stripped.endswith(("?", "？")):
        return True
    if language == "zh":
        return stripped.endswith(("吗", "么", "呢")) and "我" not in stripped[:2]
    return bool(_EN_QUESTION_START.match(sentence))


_CONTRACTIONS = (
    (re.compile(r"\b(?:I'm|I’m|Im)\b", re.IGNORECASE), "I am"),
    (re.compile(r"\bI(?:'|’)ve\b", re.IGNORECASE), "I have"),
    (re.compile(r"\bI(?:'|’)ll\b", re.IGNORECASE), "I will"),
    (re.compile(r"\bI(?:'|’)d\b", re.IGNORECASE), "I would"),
    (re.compile(r"\bi\b"), "I"),
    (re.compile(r"\b(?:dont|don't|don’t)\b", re.IGNORECASE), "do not"),
    (re.compile(r"\b(?:cant|can't|can’t)\b", re.IGNORECASE), "cannot"),
    (re.compile(r"\s+(?:lol|haha+|lmao|:\)|:D)\s*$", re.IGNORECASE), ""),
)


def canonical_fact(clause: str) -> str:
    """A clause in plain first-person form: contractions spelled out, capitalised, one full stop."""
    text = clause.strip()
    for pattern, replacement in _CONTRACTIONS:
        text = pattern.sub(replacement, text)
    text = re.sub(r"\s+", " ", text).strip(" .!?,;:")
    return (text[:1].upper() + text[1:] + ".") if text else text


def _scored_facts(
    text: str, scorer: FactScorer, limit: int | None, read: Sequence[str], source_seq: int
) -> list[Constraint]:
    """The clauses the scorer rates as self-disclosure, but none the typed rules read
    (``read``: their values and the words they matched, retractions included)."""
    typed_words = {w for r in read for w in content_words(r)}
    out = []
    for clause, _ in scorer.select(text, limit):
        if _MARKUP.search(clause.text):
            continue
        words = content_words(clause.text)
        # A clause a typed rule already read ("I live in Boston") is not pinned twice.
        if not words or sum(w in typed_words for w in words) / len(words) >= 0.6:
            continue
        value = canonical_fact(clause.text)
        out.append(Constraint(key=f"fact:{normalise(value, limit=4)}", value=value, kind="fact",
                              source_seq=source_seq, quote=clause.text[:200]))
    return out


def extract_constraints(
    text: str,
    *,
    source_seq: int = 0,
    generic_facts: bool = True,
    max_generic: int | None = None,
    scorer: FactScorer | Literal[False] | None = None,
) -> tuple[list[Constraint], list[Retract]]:
    """Constraints stated in ``text`` and retractions, in the order they appear.

    ``max_generic`` bounds the untyped first-person facts taken from one text. English
    untyped facts come from ``scorer`` (default: the shipped `FactScorer`); with
    ``scorer=False`` (or no model file) the first-person patterns are used instead, clauses
    led by a typical self-description ("I work…", "My wife…") first.
    """
    language = detect_language(text)
    model: FactScorer | None = None
    if language == "en" and generic_facts and scorer is not False:
        model = scorer or default_scorer()
    found: list[Constraint] = []
    retracted: list[Retract] = []
    generic_found: list[tuple[int, int, Constraint]] = []
    read: list[str] = []
    for sentence in _statements(text, language):
        for hit in _sentence_hits(sentence, language, generic_facts=generic_facts and model is None):
            if isinstance(hit, Retract) or ":" not in hit.key:
                # A one-valued fact ("budget", "location") or a retraction is never pinned
                # again as a raw clause: that copy would keep the old value after an update.
                read.append(hit.matched)
            if isinstance(hit, Retract):
                retracted.append(hit)
                continue
            constraint = Constraint(
                key=hit.key, value=hit.value, kind=hit.kind, source_seq=source_seq,
                quote=sentence[:200],
            )
            if hit.kind == "fact":
                rank = 0 if is_fact_head(hit.value) else 1
                generic_found.append((rank, len(found) + len(generic_found), constraint))
            else:
                found.append(constraint)
    if max_generic is not None:
        generic_found = sorted(generic_found)[:max_generic]
    found.extend(c for _, _, c in sorted(generic_found, key=lambda item: item[1]))
    if model is not None:
        read.extend(c.value for c in found)
        found.extend(_scored_facts(text, model, max_generic, read, source_seq))
    return found, retracted


def _statements(text: str, language: str) -> list[str]:
    """The sentences of ``text`` that may state something about the user."""
    kept = []
    for sentence in _sentences(text, language):
        if _is_question(sentence, language) or _MARKUP.search(sentence):
            continue  # markup ("</script>") is never a statement about the user
        if language == "zh" and _ZH_OTHER_SUBJECT.match(sentence):
            continue  # "我朋友不吃辣" is about the friend, not the user
        kept.append(sentence)
    return kept


def _sentence_hits(sentence: str, language: str, *, generic_facts: bool) -> list[Found | Retract]:
    """What the typed rules find in ``sentence`` and, with ``generic_facts``, the
    first-person patterns' facts the typed rules did not already read."""
    hits: list[Found | Retract] = []
    for rule in zh_rules() if language == "zh" else en_rules():
        hits.extend(rule(sentence))
    if generic_facts:
        generic = zh_generic if language == "zh" else en_generic
        typed_words = {w for h in hits for w in content_words(f"{h.value if isinstance(h, Found) else ''} {h.matched}")}
        for fact in generic(sentence):
            words = content_words(fact.value) if isinstance(fact, Found) else []
            # A clause a typed rule already read ("I live in Boston") is not pinned twice.
            if words and sum(w in typed_words for w in words) / len(words) < 0.6:
                hits.append(fact)
    return hits


def _retracted_keys(retracts: Iterable[Retract], current: Sequence[Constraint]) -> list[str]:
    keys: list[str] = []
    for retract in retracts:
        for constraint in current:
            if retract.matches(constraint) and constraint.key not in keys:
                keys.append(constraint.key)
        if retract.key and retract.key not in keys:
            keys.append(retract.key)
    return keys


class OfflineConstraintExtractor(ModelFree):
    """`ConstraintExtractor` from Chinese and English patterns; no network, deterministic.

    ``generic_facts`` adds other first-person statements ("I play guitar") as ``fact``
    entries, at most ``max_generic_facts`` a turn; turn it off to pin only the typed
    constraints and identity facts. English ones are chosen by ``fact_scorer`` (default:
    the shipped model file, pure-Python inference); ``fact_scorer=False`` keeps the older
    first-person patterns.
    """

    def __init__(
        self, *, generic_facts: bool = True, max_generic_facts: int | None = 3,
        fact_scorer: FactScorer | Literal[False] | None = None,
    ) -> None:
        self.generic_facts = generic_facts
        self.max_generic_facts = max_generic_facts
        self.fact_scorer = fact_scorer

    async def extract(self, turn: Turn, current: Sequence[Constraint]) -> ConstraintUpdate:
        """Constraints stated in a user ``turn``; assistant and system turns give none."""
        if turn.role != "user":
            return ConstraintUpdate()
        return self.extract_text(turn.content, current, source_seq=turn.seq)

    def extract_alone(self, turn: Turn) -> ConstraintUpdate | None:
        """`extract` without the stored constraints (`StandaloneExtractor`): only a
        retraction is matched against them, so ``None`` for a turn that retracts something.
        (The constraints job asks this first: a subclass that changes `extract` changes this too.)"""
        if turn.role != "user":
            return ConstraintUpdate()
        found, retracts = self._found(turn.content, turn.seq)
        return None if retracts else _update(found, [])

    def extract_text(
        self, text: str, current: Sequence[Constraint] = (), *, source_seq: int = 0
    ) -> ConstraintUpdate:
        """Same as `extract` on plain text, synchronous (evaluation, CLI)."""
        found, retracts = self._found(text, source_seq)
        return _update(found, _retracted_keys(retracts, current))

    def _found(self, text: str, source_seq: int) -> tuple[list[Constraint], list[Retract]]:
        return extract_constraints(
            text, source_seq=source_seq, generic_facts=self.generic_facts,
            max_generic=self.max_generic_facts, scorer=self.fact_scorer,
        )


def _update(found: Sequence[Constraint], remove: Sequence[str]) -> ConstraintUpdate:
    """The update of a turn: what it states, and the retracted keys it does not state again."""
    upserts: dict[str, Constraint] = {}
    for constraint in found:
        upserts[constraint.key] = constraint  # the last statement of a turn wins
    # A key both stated and retracted in one turn keeps the statement that came after.
    kept = [k for k in remove if k not in upserts]
    return ConstraintUpdate(upsert=tuple(upserts.values()), remove_keys=tuple(kept))


def apply_update(current: Sequence[Constraint], update: ConstraintUpdate) -> list[Constraint]:
    """Merge ``update`` into ``current``: retracted keys go, a newer value replaces the older
    one with the same key where it stood, new keys are appended (pinning order kept)."""
    removed = set(update.remove_keys)
    merged = [c for c in current if c.key not in removed]
    position = {c.key: i for i, c in enumerate(merged)}
    for constraint in update.upsert:
        if constraint.key in position:
            merged[position[constraint.key]] = constraint
        else:
            position[constraint.key] = len(merged)
            merged.append(constraint)
    return merged
