"""Count ``Any`` in the package's annotations (issue #34's figure), per module and in total.

An AST walk over ``src/contextmode``: every ``Any`` name (``Any`` or ``typing.Any``) inside an
argument annotation (``*args`` and ``**kwargs`` included), a return annotation or a variable
annotation (``x: T``, class fields included) counts once; string annotations are parsed and
counted the same way. ``Any`` elsewhere (``cast(Any, …)``, a type alias ``X = dict[str, Any]``)
is not counted: an alias is counted where it is used only if its name is ``Any``.

Run: ``python scripts/count_any.py`` (total and the 15 busiest modules), ``--all`` for every
module with a count, ``--total`` for the number alone; ``--root DIR`` counts another checkout's
package (``--root ../main/src/contextmode``: the figure before a change).
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "contextmode"


def _any_names(annotation: ast.expr | None) -> int:
    if annotation is None:
        return 0
    count = 0
    for node in ast.walk(annotation):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name == "Any":
            count += 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                inner = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                continue
            count += _any_names(inner)
    return count


def _annotations(tree: ast.AST) -> Iterator[ast.expr | None]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
                if arg is not None:
                    yield arg.annotation
            yield node.returns
        elif isinstance(node, ast.AnnAssign):
            yield node.annotation


def count_file(path: Path) -> int:
    """The ``Any`` names in the annotations of one module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return sum(_any_names(a) for a in _annotations(tree))


def counts(root: Path = PACKAGE) -> dict[str, int]:
    """Module path (relative to the package) → its count, for every module with one."""
    found = {str(p.relative_to(root)): count_file(p) for p in sorted(root.rglob("*.py"))}
    return {name: n for name, n in found.items() if n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every module with a count")
    parser.add_argument("--total", action="store_true", help="print the total only")
    parser.add_argument("--root", type=Path, default=PACKAGE, help="the package folder to count")
    args = parser.parse_args()
    per_module = counts(args.root)
    total = sum(per_module.values())
    if args.total:
        print(total)
        return
    rows = sorted(per_module.items(), key=lambda item: (-item[1], item[0]))
    for name, n in rows if args.all else rows[:15]:
        print(f"{n:5d}  {name}")
    print(f"{total:5d}  total ({len(per_module)} modules)")


if __name__ == "__main__":
    main()
