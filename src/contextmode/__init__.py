"""context-mode: what an LLM chat model should see, inside a token budget."""

__version__ = "0.1.0"
