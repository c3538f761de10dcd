"""Layering: a module imports its own layer and the ones below it, never one above.

The order, lowest first (see docs/architecture.md):

0. ``types``, ``errors``, ``settings``, ``jsonparse``, ``prompts``, ``_protocols``, ``session_keys``: plain data,
   configuration and the cached optional-ability check (``implements``);
1. ``text``: language detection, jieba tokenisation, the shared per-text analysis;
2. ``tokens``: token counters;
3. ``models``: chat models;
4. ``processors``: detector, rewriter, extractor, summariser, emotion scorer;
5. ``store``: persistence, the kept trace records (``store.records``);
6. ``memory``: strategies and recall;
7. ``assembly``: the context window;
8. ``jobs``, ``engine``, ``agent_turn``, ``lifecycle``: the turn;
9. ``api``, ``service``, ``cli``, ``evaluation``, ``testing``: the edges.

Imports inside functions and under ``TYPE_CHECKING`` count too: a lazy import that runs
back up the layers is still a cycle in the design. Checked for the lower packages, where
a wrong import is easiest to add unnoticed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import contextmode

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"types", "errors", "settings", "jsonparse", "prompts", "_protocols", "session_keys"}),
    frozenset({"text"}),
    frozenset({"tokens"}),
    frozenset({"models"}),
    frozenset({"processors"}),
    frozenset({"store"}),
    frozenset({"memory"}),
    frozenset({"assembly"}),
    frozenset({"jobs", "engine", "agent_turn", "lifecycle"}),
    frozenset({"api", "service", "cli", "evaluation", "testing", "integrations", "__main__"}),
)
CHECKED = ("text", "models", "processors", "store")
ROOT = Path(contextmode.__file__).parent


def layer_of(top: str) -> int:
    """The layer of a top-level module or package of contextmode."""
    for index, names in enumerate(LAYERS):
        if top in names:
            return index
    raise AssertionError(f"contextmode.{top} has no layer: add it to LAYERS")


def package_of(path: Path) -> tuple[str, ...]:
    """The package a module file belongs to, e.g. ``("contextmode", "processors")``."""
    return path.relative_to(ROOT.parent).parts[:-1]


def imported_tops(source: str, package: tuple[str, ...]) -> set[str]:
    """Top-level contextmode modules that ``source``, a module of ``package``, imports
    (relative or absolute imports)."""
    tops: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                parts = [*base, *(node.module.split(".") if node.module else [])]
                names = [".".join(parts)] if node.module else [".".join([*parts, a.name]) for a in node.names]
            elif node.module:
                names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "contextmode" and len(parts) > 1:
                tops.add(parts[1])
    return tops


MODULES = sorted(p for top in CHECKED for p in (ROOT / top).rglob("*.py"))


def test_every_top_level_module_has_a_layer() -> None:
    tops = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    for top in tops:
        layer_of(top)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_import_runs_up_the_layers(path: Path) -> None:
    own = layer_of(path.relative_to(ROOT).parts[0])
    imported = imported_tops(path.read_text(encoding="utf-8"), package_of(path))
    above = {top for top in imported if layer_of(top) > own}
    assert not above, f"{path.relative_to(ROOT)} imports a higher layer: {sorted(above)}"


def test_the_checker_sees_upward_imports() -> None:
    # The rule must be able to fail: lazy, relative and absolute imports are all seen.
    source = ("def f():\n    from ..engine import Engine\n    from ..text import is_chinese\n"
              "    from . import intents\n    import contextmode.service.app\n")
    tops = imported_tops(source, ("contextmode", "processors"))
    assert tops == {"engine", "text", "processors", "service"}
    assert max(layer_of(t) for t in tops) > layer_of("processors")
