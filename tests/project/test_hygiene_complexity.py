"""No function in src/contextmode above cyclomatic complexity 20 (radon, as ``radon cc -n D``
counts it, closures included) or with more than 8 parameters (``self``/``cls`` not counted)."""

from __future__ import annotations

import ast
from pathlib import Path

from radon.complexity import add_inner_blocks, cc_visit
from radon.visitors import Function

SRC = Path(__file__).resolve().parents[2] / "src" / "contextmode"
MAX_COMPLEXITY = 20
MAX_PARAMETERS = 8



def _sources() -> list[tuple[str, str]]:
    return [(p.relative_to(SRC).as_posix(), p.read_text(encoding="utf-8")) for p in sorted(SRC.rglob("*.py"))]


def complexities(relative: str, code: str) -> dict[str, int]:
    """Each function's cyclomatic complexity by ``path:Qualified.name``."""
    found: dict[str, int] = {}
    for block in add_inner_blocks(cc_visit(code)):
        if isinstance(block, Function):
            found[f"{relative}:{block.fullname}"] = block.complexity
    return found


def parameter_counts(relative: str, code: str) -> dict[str, int]:
    """Each function's parameters by ``path:Qualified.name`` (a method's ``self``/``cls`` excluded;
    ``*args`` and ``**kwargs`` count one each)."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                a = child.args
                positional = [x.arg for x in (*a.posonlyargs, *a.args)]
                count = len(positional) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
                if positional and positional[0] in ("self", "cls") and isinstance(node, ast.ClassDef):
                    count -= 1
                found[f"{relative}:{prefix}{child.name}"] = count
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(code), "")
    return found


def test_the_checks_see_what_they_must() -> None:
    branches = "\n".join(f"        if x == {i}:\n            return {i}" for i in range(21))
    code = f"class K:\n    def m(self, x, a, b, c, d, e, f, g, *rest, **more):\n{branches}\n        return -1\n"
    assert complexities("k.py", code) == {"k.py:K.m": 22}
    assert parameter_counts("k.py", code) == {"k.py:K.m": 10}
    assert parameter_counts("f.py", "def f(self, a):\n    def inner(b, /, c, *, d): ...\n") == {
        "f.py:f": 2, "f.py:f.inner": 3,
    }


def test_no_function_above_complexity_20() -> None:
    found: dict[str, int] = {}
    for relative, code in _sources():
        found.update(complexities(relative, code))
    assert len(found) > 500  # the whole package was read
    over = {name: cc for name, cc in found.items() if cc > MAX_COMPLEXITY}
    assert over == {}, over


def test_no_function_with_more_than_8_parameters() -> None:
    found: dict[str, int] = {}
    for relative, code in _sources():
        found.update(parameter_counts(relative, code))
    over = {name: n for name, n in found.items() if n > MAX_PARAMETERS}
    assert over == {}, over
