"""Count the methods of the driver protocols and of each backend's driver (AST, no import).

    python benchmarks/count_driver_methods.py

A class counts its public methods and those of its bases found under ``src/contextmode/store``
(``Protocol`` and ``Generic`` aside): the core a new backend writes is ``Driver`` +
``KeyedRecords``; a shipped driver's count is the core it has plus its native abilities.
"""

from __future__ import annotations

import ast
from pathlib import Path

STORE = Path(__file__).resolve().parent.parent / "src" / "contextmode" / "store"
PROTOCOLS = ("Driver", "KeyedRecords", "ConnectionDriver", "LockDriver", "TurnsAtDriver", "JobDriver",
             "TraceDriver", "IdempotencyDriver", "UserDriver", "PurgeDriver", "LifecycleDriver",
             "IndexDriver", "BatchingDriver")
DRIVERS = ("MinimalDriver", "MemoryDriver", "SQLiteDriver", "RedisDriver", "PostgresDriver")


def _classes() -> dict[str, ast.ClassDef]:
    found: dict[str, ast.ClassDef] = {}
    for path in sorted(STORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, node)
    return found


def _base_name(base: ast.expr) -> str | None:
    if isinstance(base, ast.Subscript):
        base = base.value
    if isinstance(base, ast.Name):
        return base.id
    return base.attr if isinstance(base, ast.Attribute) else None


def methods(name: str, classes: dict[str, ast.ClassDef]) -> set[str]:
    node = classes[name]
    own = {n.name for n in node.body
           if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and not n.name.startswith("_")}
    for base in node.bases:
        base_name = _base_name(base)
        if base_name in classes:
            own |= methods(base_name, classes)
    return own


def main() -> None:
    classes = _classes()
    core = methods("Driver", classes) | methods("KeyedRecords", classes)
    print(f"core (Driver + KeyedRecords): {len(core)}")
    for name in PROTOCOLS + DRIVERS:
        print(f"{name}: {len(methods(name, classes))}")


if __name__ == "__main__":
    main()
