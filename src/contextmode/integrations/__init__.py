"""Adapters onto the memory seams of the agent frameworks people already use.

Each module is a thin, typed translation onto the public `contextmode.ContextMode` API
(no second engine) and needs its framework's extra (docs/integrations.md):

- `contextmode.integrations.openai_agents`: `ContextModeSession`, an OpenAI Agents SDK
  ``Session`` (``pip install 'contextmode-engine[openai-agents]'``);
- `contextmode.integrations.pydantic_ai`: `ContextModeHistory`, a pydantic-ai
  ``history_processors`` callable (``pip install 'contextmode-engine[pydantic-ai]'``);
- `contextmode.integrations.mcp_server`: the MCP server behind ``contextmode mcp``
  (``pip install 'contextmode-engine[mcp]'``);
- `contextmode.integrations.langchain`: `ContextModeMiddleware` for LangChain's
  ``create_agent`` (and LangGraph's ``create_react_agent``), `ContextModeChatMessageHistory`
  for ``RunnableWithMessageHistory`` (``pip install 'contextmode-engine[langchain]'``);
- `contextmode.integrations.llama_index`: `ContextModeMemory`, a LlamaIndex memory for chat
  engines and agents (``pip install 'contextmode-engine[llama-index]'``).

The Anthropic-compatible proxy (``POST /v1/messages``) is part of the service
(`contextmode.service.routes_anthropic`).
"""
