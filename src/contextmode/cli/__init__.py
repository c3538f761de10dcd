"""The ``contextmode`` command: demo, serve, chat, inspect, replay, eval."""

from __future__ import annotations

from .app import app, main

__all__ = ["app", "main"]
