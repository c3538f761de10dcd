"""How precisely ``pii="mask"`` finds personal data: a small zh + en table, precision and recall.

``contextmode eval pii`` runs `contextmode.text.pii.find_pii` over `CASES`: sentences
holding phone numbers, resident ID numbers, bank card numbers and e-mail addresses, and
near-misses that must stay as typed (order numbers, prices, dates, times, versions, an ID
with a wrong check digit, a card number that fails Luhn, a 16-digit order number that
passes Luhn but starts with no issuer's digit). A found value counts as right when its
text is exactly one of the case's expected values; precision = right / found, recall =
right / expected, per kind and overall. The card numbers are the issuers' published test
numbers and the ID numbers are made up (valid check digits, nobody's).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import typer

from .report import JsonFlag, print_figures, print_json_line

__all__ = ["CASES", "PiiCase", "evaluate_pii", "register"]


@dataclass(frozen=True, slots=True)
class PiiCase:
    """A sentence and the personal values in it (none for a near-miss), by kind."""

    text: str
    expected: tuple[tuple[str, str], ...] = ()
    """``(kind, value)`` pairs, ``value`` exactly as it appears in ``text``."""


CASES: tuple[PiiCase, ...] = (
    # Chinese: positives
    PiiCase("我的手机号是13812345678，有事打我", (("phone", "13812345678"),)),
    PiiCase("电话 138-1234-5678 或者 139 1234 5678 都行", (("phone", "138-1234-5678"), ("phone", "139 1234 5678"))),
    PiiCase("国际号码 +86 186 0000 1234，白天打", (("phone", "+86 186 0000 1234"),)),
    PiiCase("座机是010-62345678，分机转8", (("phone", "010-62345678"),)),
    PiiCase("身份证号11010519491231002X，麻烦核对", (("id_card", "11010519491231002X"),)),
    PiiCase("我的身份证 330106198511224564 丢了", (("id_card", "330106198511224564"),)),
    PiiCase("退款打到这张卡：6222021234567890128", (("bank_card", "6222021234567890128"),)),
    PiiCase("卡号 6214 8300 1122 3344 58 是招行的", (("bank_card", "6214 8300 1122 3344 58"),)),
    PiiCase("邮箱 zhang.san@example.com，发票寄这里", (("email", "zhang.san@example.com"),)),
    PiiCase("联系人王女士，手机15900001111，邮箱wang_li@corp.example.cn",
            (("phone", "15900001111"), ("email", "wang_li@corp.example.cn"))),
    # Chinese: near-misses
    PiiCase("订单号 20231105123456 已发货"),
    PiiCase("订单号：2023110513812345678，请查收"),
    PiiCase("物流单号 SF1234567890123"),
    PiiCase("价格 1299.00 元，优惠后 ¥1,099"),
    PiiCase("版本 3.10.2 在 2023-11-05 14:30 发布"),
    PiiCase("2023年11月5日下午3点半见"),
    PiiCase("身份证号 110105194912310021 好像填错了"),
    PiiCase("编号 110105194913310021 不是身份证（没有13月）"),
    PiiCase("卡号 6222021234567890123 不对"),
    PiiCase("房间号 1381，楼层 13，工号 20231234"),
    PiiCase("验证码 834921，五分钟内有效"),
    # English: positives
    PiiCase("Call me at +1 415-555-2671 after six.", (("phone", "+1 415-555-2671"),)),
    PiiCase("My number is (415) 555-2671.", (("phone", "(415) 555-2671"),)),
    PiiCase("Reach the London office on +44 20 7946 0958", (("phone", "+44 20 7946 0958"),)),
    PiiCase("Card 4111 1111 1111 1111 expires soon", (("bank_card", "4111 1111 1111 1111"),)),
    PiiCase("Charge my Amex 378282246310005 please", (("bank_card", "378282246310005"),)),
    PiiCase("Mastercard 5520-2000-0000-0006 was declined", (("bank_card", "5520-2000-0000-0006"),)),
    PiiCase("Email me at jane.doe+news@example.org", (("email", "jane.doe+news@example.org"),)),
    PiiCase("Send it to ops@mail.example.co.uk or call +33 1 42 68 53 00",
            (("email", "ops@mail.example.co.uk"), ("phone", "+33 1 42 68 53 00"))),
    # English: near-misses
    PiiCase("Order #4111111111111112 shipped"),
    PiiCase("Invoice 2023110512345678 totals $1,299.99"),
    PiiCase("Upgrade to v2.14.3-rc1 on 2024-02-29 at 09:45:00"),
    PiiCase("The meeting is at 10:30 in room 415"),
    PiiCase("Tracking 1Z999AA10123456784 via UPS"),
    PiiCase("IP 192.168.1.254 and port 8080"),
    PiiCase("Reference 20240229 and ISBN 978-3-16-148410-0"),
    PiiCase("user@localhost is not an address we mail"),
)


def evaluate_pii(cases: tuple[PiiCase, ...] = CASES) -> dict[str, Any]:
    """Precision and recall of `find_pii` on ``cases``, overall and per kind."""
    from ..text.pii import PII_KINDS, find_pii, require_pii_libraries

    require_pii_libraries()
    right: Counter[str] = Counter()
    found: Counter[str] = Counter()
    expected: Counter[str] = Counter()
    clean = 0
    for case in cases:
        gold = Counter(case.expected)
        got: Counter[tuple[str, str]] = Counter((span.kind, case.text[span.start:span.end]) for span in find_pii(case.text))
        for (found_kind, _), n in got.items():
            found[found_kind] += n
        for (gold_kind, _), n in gold.items():
            expected[gold_kind] += n
        for pair, n in (got & gold).items():
            right[pair[0]] += n
        clean += not case.expected and not got
    result: dict[str, Any] = {
        "cases": len(cases),
        "precision": _ratio(sum(right.values()), sum(found.values())),
        "recall": _ratio(sum(right.values()), sum(expected.values())),
        "near_misses_untouched": f"{clean}/{sum(1 for c in cases if not c.expected)}",
    }
    for kind in PII_KINDS:
        result[f"{kind}_precision"] = _ratio(right[kind], found[kind])
        result[f"{kind}_recall"] = _ratio(right[kind], expected[kind])
    return result


def _ratio(num: int, den: int) -> float:
    return round(num / den, 3) if den else 1.0


def register(app: typer.Typer) -> None:
    """Add the ``pii`` evaluation subcommand to ``app``."""

    @app.command("pii")
    def pii_command(as_json: JsonFlag = False) -> None:
        """Personal-data masking: precision and recall on a small zh + en table (pii="mask")."""
        result = evaluate_pii()
        print_figures("personal-data masking (zh + en table)", result)
        if as_json:
            print_json_line(result)
