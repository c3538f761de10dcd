"""``contextmode eval pii``: the personal-data table, precision and recall, and the masks."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from contextmode.cli.app import app
from contextmode.evaluation.pii import CASES, PiiCase, evaluate_pii
from contextmode.text.pii import mask_pii


def test_the_table_has_zh_and_en_positives_and_near_misses() -> None:
    kinds = {kind for case in CASES for kind, _ in case.expected}
    assert kinds == {"phone", "id_card", "bank_card", "email"}
    assert sum(1 for c in CASES if not c.expected) >= 15
    assert any("订单" in c.text for c in CASES if not c.expected)
    assert any("Order" in c.text for c in CASES if not c.expected)


def test_every_case_is_found_exactly() -> None:
    result = evaluate_pii()
    assert (result["precision"], result["recall"]) == (1.0, 1.0), result


def test_a_wrong_answer_lowers_the_figures() -> None:
    wrong = (PiiCase("订单号 20231105123456", (("phone", "20231105123456"),)), PiiCase("电话 13812345678"))
    result = evaluate_pii(wrong)
    assert result["recall"] == 0.0 and result["precision"] == 0.0


def test_masks_keep_the_ends() -> None:
    assert mask_pii("手机13812345678").text == "手机138****5678"
    assert mask_pii("卡 4111 1111 1111 1111").text == "卡 4111 **** **** 1111"
    assert mask_pii("id 11010519491231002X").text == "id 110***********002X"
    assert mask_pii("mail jane.doe@example.org.").text == "mail j***@example.org."
    assert mask_pii("+86 139 1234 5678").text == "+86 139 **** 5678"


def test_the_command_prints_the_figures() -> None:
    result = CliRunner().invoke(app, ["eval", "pii", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["precision"] == 1.0 and figures["cases"] == len(CASES)
