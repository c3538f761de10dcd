"""Evaluation of context-mode against public dialogue datasets (paths given by the caller)."""
