"""Adapters onto the memory seams of the agent frameworks people already use.

Each module is a thin, typed translation onto the public `contextmode.ContextMode` API
(no second engine) and needs its framework's extra (docs/integrations.md):

- `contextmode.integrations.langchain`: `ContextModeMiddleware` for LangChain's
  ``create_agent`` (and LangGraph's ``create_react_agent``), `ContextModeChatMessageHistory`
  for ``RunnableWithMessageHistory`` (``pip install 'contextmode-engine[langchain]'``);
- `contextmode.integrations.llama_index`: `ContextModeMemory`, a LlamaIndex memory for chat
  engines and agents (``pip install 'contextmode-engine[llama-index]'``).
"""
