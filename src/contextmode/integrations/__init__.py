"""context-mode's memory where applications already are: one module per framework or protocol,
each behind its own extra (docs/integrations.md)."""
