"""Adapters onto the memory seams of the agent frameworks people already use.

Each module is a thin, typed translation onto the public `contextmode.ContextMode` API
(no second engine) and needs its framework's extra (docs/integrations.md):

- `contextmode.integrations.openai_agents`: `ContextModeSession`, an OpenAI Agents SDK
  ``Session`` (``pip install 'contextmode[openai-agents]'``);
- `contextmode.integrations.pydantic_ai`: `ContextModeHistory`, a pydantic-ai
  ``history_processors`` callable (``pip install 'contextmode[pydantic-ai]'``).
"""
