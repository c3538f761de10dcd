"""The model layer: the `ChatModel` seam, an OpenAI-compatible client, the offline responder.

Fakes for tests (`FunctionModel`, `ScriptedModel`) and the OpenAI-protocol stub
server live in `contextmode.testing`.
"""

from .base import ChatModel
from .factory import model_from_env
from .offline import OfflineResponder
from .openai import ModelUsage, OpenAIChatModel, OpenAIOptions, map_openai_error
from .settings import ALLOW_MODEL_REQUESTS_ENV, LLMSettings, check_model_request_allowed

__all__ = [
    "ALLOW_MODEL_REQUESTS_ENV",
    "ChatModel",
    "LLMSettings",
    "ModelUsage",
    "OfflineResponder",
    "OpenAIChatModel",
    "OpenAIOptions",
    "check_model_request_allowed",
    "map_openai_error",
    "model_from_env",
]
