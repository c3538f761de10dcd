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


def test_record_stores_turns_without_the_model_and_reads_them_back() -> None:
    from contextmode import ContextMode

    cm = ContextMode(store="memory://")
    try:
        cm.record("s1", "user", "我不吃辣，预算五十以内", user_id="u1")
        cm.record("s1", "assistant", "好的，给你找不辣的店。")
        cm.drain()
        turns = cm.turns("s1")
        assert [(t.role, t.content) for t in turns] == [
            ("user", "我不吃辣，预算五十以内"),
            ("assistant", "好的，给你找不辣的店。"),
        ]
        assert cm.turns("unknown") == []
        ctx = cm.context("s1", "那家店在哪？")
        recent = ctx.layer("recent")
        assert recent is not None and any("不吃辣" in str(item) for item in recent.items)
    finally:
        cm.close()
