"""The public surface is small, complete and sorted (httpx's test)."""

import contextmode


def test_all_is_complete_and_importable() -> None:
    names = contextmode.__all__  # ruff's RUF022 keeps it sorted
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(contextmode, name), name


def test_error_tree_has_one_root() -> None:
    from contextmode import errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.ContextModeError)
        assert name in (errors.__doc__ or ""), f"{name} is not drawn in errors.py's docstring"
