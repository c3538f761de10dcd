"""context-mode: what an LLM chat model should see, inside a token budget.

```python
from contextmode import ContextMode

cm = ContextMode()
cm.chat("demo", "我不吃辣，预算五十以内")
print(cm.context("demo", "推荐一家餐厅").summary_line())
```
"""

from ._version import __version__
from .agent_turn import AgentRequest, ToolResult
from .api import ContextMode, build_engine
from .assembly import AssemblyConfig, Context, assemble, to_anthropic, to_messages, to_text
from .engine import Engine, PreparedTurn, Processors, TurnEvent, TurnRequest, TurnResult
from .errors import (
    ConfigError,
    ContextModeError,
    InputError,
    MessageTooLarge,
    ModelError,
    NoPreviousAnswer,
    SessionNotFound,
    StoreError,
    UserError,
)
from .memory import Budget, get_strategy
from .settings import EngineSettings
from .types import (
    ChatMessage,
    Constraint,
    NewTurn,
    SessionKey,
    SessionState,
    Summary,
    ToolCall,
    Turn,
    tool_metadata,
)

__all__ = [
    "AgentRequest",
    "AssemblyConfig",
    "Budget",
    "ChatMessage",
    "ConfigError",
    "Constraint",
    "Context",
    "ContextMode",
    "ContextModeError",
    "Engine",
    "EngineSettings",
    "InputError",
    "MessageTooLarge",
    "ModelError",
    "NewTurn",
    "NoPreviousAnswer",
    "PreparedTurn",
    "Processors",
    "SessionKey",
    "SessionNotFound",
    "SessionState",
    "StoreError",
    "Summary",
    "ToolCall",
    "ToolResult",
    "Turn",
    "TurnEvent",
    "TurnRequest",
    "TurnResult",
    "UserError",
    "__version__",
    "assemble",
    "build_engine",
    "get_strategy",
    "to_anthropic",
    "to_messages",
    "to_text",
    "tool_metadata",
]
