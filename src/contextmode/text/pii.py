"""Personal data found and masked in text: phone numbers, Chinese resident IDs, bank cards, e-mails.

Used by the engine when ``EngineSettings(pii="mask")``: every turn is masked before it
is stored, so nothing made from the log (pins, summary, key moments, recall index,
traces, exports) ever holds the values. The parsing is done by well-kept libraries
(the ``pii`` extra): `phonenumbers` finds and validates phone numbers, `python-stdnum`
checks a resident ID's birth date and check digit (``stdnum.cn.ric``) and a
card number's Luhn sum. What is masked, to stay precise:

- a phone number ``phonenumbers`` finds valid: a Chinese mobile (``13812345678``,
  ``138-1234-5678``), any number written with its country code (``+1 415-555-2671``),
  or a landline written with separators (``010-62345678``, ``(415) 555-2671``); a bare
  digit run that is not a mobile number (an order number) is left alone;
- an 18-character resident ID whose check digit and birth date are valid (``stdnum.cn.ric``;
  not its place, whose table lags new districts);
- a card number of 13-19 digits (groups of 4 allowed) whose Luhn sum is right and whose
  first digit is an issuer's (3 to 6; UnionPay cards start with 62);
- an e-mail address.

Digits between the first three and the last four are replaced by ``*`` (``138****5678``),
a card keeps its first and last four, an address its first character and its domain
(``z***@example.com``). Dates, times, prices and version strings never match.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..errors import ConfigError
from ..types import JsonValue

__all__ = [
    "PII_KINDS", "JsonValue", "Masked", "PiiKind", "PiiSpan", "find_pii", "mask_json", "mask_pii", "require_pii_libraries",
]

PiiKind = Literal["phone", "id_card", "bank_card", "email"]
PII_KINDS: tuple[PiiKind, ...] = ("phone", "id_card", "bank_card", "email")


@dataclass(frozen=True, slots=True)
class PiiSpan:
    """One personal value found in a text: ``text[start:end]``."""

    kind: PiiKind
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Masked:
    """A text with its personal values masked, and how many of each kind there were."""

    text: str
    counts: Mapping[PiiKind, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def require_pii_libraries() -> None:
    """Raise `ConfigError` when the ``pii`` extra is not installed (checked when ``mask`` is set)."""
    try:
        import phonenumbers  # noqa: F401
        import stdnum.cn.ric
        import stdnum.luhn  # noqa: F401
    except ImportError:
        raise ConfigError(
            "pii='mask' needs phonenumbers and python-stdnum: pip install 'contextmode-engine[pii]'"
        ) from None


_DIGITS_BOUNDARY = r"(?<![0-9A-Za-z])"
_DIGITS_END = r"(?![0-9A-Za-z])"
_ID_CANDIDATE = re.compile(_DIGITS_BOUNDARY + r"\d{17}[\dXx]" + _DIGITS_END)
_CARD_CANDIDATE = re.compile(_DIGITS_BOUNDARY + r"[3-6]\d{3}(?:[ -]?\d{4}){2}(?:[ -]?\d{1,4}){1,2}" + _DIGITS_END)
_EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24}\b",
                    re.ASCII)
_PHONE_REGIONS = ("CN", "US")
_SEPARATED = re.compile(r"[\s\-().]")


_PHONE_RUN = re.compile(r"\+?\(?\d[\d \t().\-]{5,30}\d")
"""Where a phone number may be: a run of digits and separators with 7 digits or more. The
matcher only looks there (around it): on a long text full of short numbers it is 100x faster."""
_CONTEXT = 3
_MOBILE_DIGITS = re.compile(r"(?:86)?1\d{10}")


def _phone_windows(text: str) -> Iterator[tuple[int, int, tuple[str, ...]]]:
    """Stretches of ``text`` worth giving the phone matcher (merged when they touch), with the
    regions to read them in: bare digits only as a Chinese mobile."""
    start = end = -1
    regions: tuple[str, ...] = ()
    for m in _PHONE_RUN.finditer(text):
        run = m.group()
        if sum(ch.isdigit() for ch in run) < 7:
            continue
        bare = run.isdigit()
        if bare and not _MOBILE_DIGITS.fullmatch(run):
            continue  # bare digits are only ever masked as a Chinese mobile (`_phones`)
        wanted = ("CN",) if bare else _PHONE_REGIONS
        lo, hi = max(0, m.start() - _CONTEXT), min(len(text), m.end() + _CONTEXT)
        if lo <= end:
            end, regions = hi, regions if len(regions) >= len(wanted) else wanted
            continue
        if end >= 0:
            yield start, end, regions
        start, end, regions = lo, hi, wanted
    if end >= 0:
        yield start, end, regions


def _phones(text: str) -> Iterator[PiiSpan]:
    import phonenumbers
    from phonenumbers import Leniency, PhoneNumberMatcher, PhoneNumberType

    for lo, hi, regions in _phone_windows(text):
        window = text[lo:hi]
        for region in regions:
            for match in PhoneNumberMatcher(window, region, leniency=Leniency.VALID):
                raw = match.raw_string
                international = raw.lstrip().startswith(("+", "00"))
                cn_mobile = (
                    match.number.country_code == 86
                    and phonenumbers.number_type(match.number) == PhoneNumberType.MOBILE
                )
                if international or (region == "CN" and cn_mobile) or _SEPARATED.search(raw.strip()):
                    yield PiiSpan("phone", lo + match.start, lo + match.end)


def _ids(text: str) -> Iterator[PiiSpan]:
    from stdnum.cn import ric

    for m in _ID_CANDIDATE.finditer(text):
        number = m.group().upper()
        # Check digit and birth date; not the place, whose table lags new districts.
        if ric.calc_check_digit(number) == number[-1] and _born(number):
            yield PiiSpan("id_card", m.start(), m.end())


def _born(number: str) -> bool:
    from stdnum.cn import ric
    from stdnum.exceptions import ValidationError

    try:
        ric.get_birth_date(number)
    except ValidationError:
        return False
    return True


def _cards(text: str) -> Iterator[PiiSpan]:
    from stdnum import luhn

    for m in _CARD_CANDIDATE.finditer(text):
        digits = re.sub(r"\D", "", m.group())
        if 13 <= len(digits) <= 19 and luhn.is_valid(digits):
            yield PiiSpan("bank_card", m.start(), m.end())


def find_pii(text: str) -> list[PiiSpan]:
    """The personal values in ``text``, in order, none overlapping (an ID or a card wins over
    a phone number read inside it). Needs the ``pii`` extra."""
    found: list[PiiSpan] = []
    for finder in (_ids, _cards, lambda t: (PiiSpan("email", m.start(), m.end()) for m in _EMAIL.finditer(t)),
                   _phones):
        for span in finder(text):
            if not any(span.start < other.end and other.start < span.end for other in found):
                found.append(span)
    return sorted(found, key=lambda s: s.start)


def _mask_digits(value: str, head: int, tail: int) -> str:
    """``value`` with its digits (and an ID's final X) between the first ``head`` and the last
    ``tail`` replaced by ``*``; separators kept."""
    positions = [i for i, ch in enumerate(value) if ch.isdigit() or ch in "Xx"]
    hidden = set(positions[head:len(positions) - tail])
    return "".join("*" if i in hidden else ch for i, ch in enumerate(value))


def _mask_value(kind: PiiKind, value: str) -> str:
    if kind == "email":
        local, _, domain = value.rpartition("@")
        return f"{local[:1]}***@{domain}"
    if kind == "bank_card":
        return _mask_digits(value, 4, 4)
    if kind == "phone" and value.startswith("+"):
        import phonenumbers

        # The country code stays readable too: +86 139****5678.
        return _mask_digits(value, len(str(phonenumbers.parse(value).country_code)) + 3, 4)
    return _mask_digits(value, 3, 4)


def mask_pii(text: str) -> Masked:
    """``text`` with every value `find_pii` finds masked (``138****5678``), and the counts."""
    if not text or not any(ch.isdigit() or ch == "@" for ch in text):
        return Masked(text)
    spans = find_pii(text)
    if not spans:
        return Masked(text)
    parts: list[str] = []
    last = 0
    for span in spans:
        parts.append(text[last:span.start])
        parts.append(_mask_value(span.kind, text[span.start:span.end]))
        last = span.end
    parts.append(text[last:])
    return Masked("".join(parts), dict(Counter(span.kind for span in spans)))


def mask_json(value: JsonValue, counts: Counter[PiiKind] | None = None) -> JsonValue:
    """``value`` (JSON-shaped: metadata, a trace) with every string in it masked; the values
    found are added to ``counts`` when given. Keys are kept as they are."""
    if isinstance(value, str):
        masked = mask_pii(value)
        if counts is not None:
            counts.update(masked.counts)
        return masked.text
    if isinstance(value, list):
        return [mask_json(v, counts) for v in value]
    if isinstance(value, dict):
        return {k: mask_json(v, counts) for k, v in value.items()}
    return value
