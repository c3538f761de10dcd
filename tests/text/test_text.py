"""The ground-floor text package: language detection and the shared per-text analysis."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from contextmode.processors.detect import OfflineContextDetector
from contextmode.processors.rewrite import OfflineRewriter
from contextmode.processors.summarize import OfflineSummarizer
from contextmode.text import analysis, analyze_text, detect_language, is_chinese, tokens
from contextmode.types import Turn, utc_now


def test_language_detection() -> None:
    assert is_chinese("hello 你好")
    assert not is_chinese("hello, world! 123")
    # One CJK character among many Latin letters is Chinese wording but English text.
    assert detect_language("please call 王 tomorrow about the invoice") == "en"
    assert detect_language("帮我查一下 Lisbon 的机票") == "zh"


def test_one_analysis_per_text() -> None:
    first = analyze_text("我妹妹叫小红")
    assert analyze_text("我妹妹叫小红") is first
    assert first.chinese and first.language == "zh"
    assert ("妹妹", "n") in first.tagged
    assert "".join(w for w, _ in first.pos) == "我妹妹叫小红"  # offsets stay exact


@pytest.fixture()
def counted_cuts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """How many times jieba tags each text, from a cold analysis cache."""
    calls: Counter[str] = Counter()
    real = tokens.pos_tags

    def counting(text: str) -> tuple[tuple[str, str], ...]:
        calls[text] += 1
        return real(text)

    monkeypatch.setattr(tokens, "pos_tags", counting)
    analysis.analyze_text.cache_clear()
    yield calls
    analysis.analyze_text.cache_clear()


def test_detector_rewriter_and_summariser_share_one_tagging(counted_cuts: Counter[str]) -> None:
    context = ["我上周去了杭州西湖。", "西湖的断桥很有名，你去过断桥吗？"]
    message = "它在哪里？"
    OfflineContextDetector().detect_texts(message, context)
    OfflineRewriter().rewrite_texts(message, context)
    OfflineContextDetector().detect_texts(message, context)
    now = utc_now()
    turns = [Turn(seq=i + 1, role="user", content=t, tokens=1, created_at=now) for i, t in enumerate(context)]
    OfflineSummarizer().summarize_text(None, turns)
    assert counted_cuts, "the processors tag through the shared analysis"
    assert max(counted_cuts.values()) == 1, counted_cuts


def test_english_text_never_loads_a_tagger(counted_cuts: Counter[str]) -> None:
    OfflineContextDetector().detect_texts("what about the second one?", ["I bought two laptops."])
    OfflineRewriter().rewrite_texts("is it fast?", ["Frank bought a Lenovo laptop.", "The Lenovo is light."])
    assert not counted_cuts


def test_text_helpers_have_one_home() -> None:
    """Every module takes the text helpers from `contextmode.text`, and none re-exports them."""
    import ast
    import importlib
    import importlib.util
    from pathlib import Path

    import contextmode
    from contextmode import text

    helpers = {name: getattr(text, name) for name in text.__all__}
    root = Path(contextmode.__file__).parent
    wrong: list[str] = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if parts[1] == "text":
            continue
        package = name if parts[-1] == "__init__" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        from_text: set[str] = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            origin = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            if origin == "contextmode.text" or origin.startswith("contextmode.text."):
                from_text |= {a.asname or a.name for a in node.names}
            elif origin.startswith("contextmode") and any(a.name in helpers for a in node.names):
                module = importlib.import_module(origin)
                wrong += [f"{name} imports {a.name} from {origin}" for a in node.names
                          if getattr(module, a.name, None) is helpers.get(a.name)]
        exported = [node.value for node in tree.body if isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)]
        names = {e.value for value in exported if isinstance(value, ast.List | ast.Tuple)
                 for e in value.elts if isinstance(e, ast.Constant)}
        wrong += [f"{name} re-exports {n}" for n in sorted(names & from_text)]
    assert wrong == []
