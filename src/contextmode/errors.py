"""The one error tree of context-mode.

```
ContextModeError
├── UserError                      misuse: wrong arguments or configuration, fix the call
│   ├── ConfigError                a setting is missing or invalid
│   ├── InvalidSessionId           a session id of the wrong length or characters
│   ├── MissingExtra               an optional dependency is not installed (names the extra)
│   └── InputError                 a message or image the caller sent is unusable
│       ├── MessageTooLarge        the current message alone does not fit the budget
│       ├── SessionExists          an import names a session the store holds with other content
│       └── EmptyMessage           the message is empty or only whitespace
├── NoPreviousAnswer               a follow-up ("举个例子") needs an answer and there is none
├── SessionNotFound                no such session for this tenant
│   └── SessionErased              erased while a turn was running: the turn stores nothing
├── TurnNotFound                   no kept trace for that turn (never kept, pruned or deleted)
├── ConflictError                  a compare-and-set lost: someone else wrote first
├── StoreError                     the store failed or is unreachable (driver errors map here)
│   └── StoreRefused               the store refused the data itself: a retry fails the same way
├── ModelError                     the chat model failed (timeouts, 429/5xx, bad output)
│   ├── ModelTimeout
│   ├── ModelUnavailable
│   │   ├── ModelPreempted     a background call cut short so a reply could have its slot
│   │   │   └── ModelDeferred  …or that waited too long for one: tried again later, not a failure
│   │   └── ModelRateLimited   the endpoint answered 429 (with its retry-after, when it gave one)
│   │       └── ModelOverloaded    …or 529 (Anthropic's "overloaded")
│   ├── ModelRefused           the endpoint refused a request the client composed (its 4xx, relayed)
│   ├── ContextWindowExceeded      a call would not fit the model's context window (never sent)
│   └── OutputRejected             the model answered, but unusably (schema, invented values)
└── LockNotAcquired                another worker holds the session's job lock
```

Driver and provider exceptions are translated once, where they are raised
(`store/*`, `models/openai.py`), with `raise X from exc`, by a table of classes
(`ErrorTable`, `translate`; the store drivers' tables are in `store/_driver_errors.py`);
the HTTP layer maps each class to one envelope code by a table too (`service/codes.py`).
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ConflictError",
    "ContextModeError",
    "ContextWindowExceeded",
    "EmptyMessage",
    "InputError",
    "InvalidSessionId",
    "LockNotAcquired",
    "MessageTooLarge",
    "MissingExtra",
    "ModelDeferred",
    "ModelError",
    "ModelOverloaded",
    "ModelPreempted",
    "ModelRateLimited",
    "ModelRefused",
    "ModelTimeout",
    "ModelUnavailable",
    "NoPreviousAnswer",
    "OutputRejected",
    "SessionErased",
    "SessionExists",
    "SessionNotFound",
    "StoreError",
    "StoreRefused",
    "TurnNotFound",
    "UserError",
]
# Also here, outside ``__all__`` (which lists the tree's classes): `ErrorTable` and `translate`.


class ContextModeError(Exception):
    """Root of every error context-mode raises on purpose."""


class UserError(ContextModeError):
    """The caller misused the library; the message says how to fix it."""


class ConfigError(UserError):
    """A setting is missing or invalid."""


class InvalidSessionId(UserError):
    """A session or tenant id is empty, too long, or has characters outside [A-Za-z0-9._:-]."""


class MissingExtra(UserError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, extra: str, module: str) -> None:
        super().__init__(
            f"{module!r} is not installed: pip install 'contextmode-engine[{extra}]'"
        )
        self.extra = extra
        self.module = module


class InputError(UserError):
    """A message, image or parameter sent by the caller is unusable."""


class SessionExists(InputError):
    """An import names a session the store already holds, with other content (``--replace``, ``--as``)."""


class MessageTooLarge(InputError):
    """The current message alone needs more tokens than the whole input budget."""

    def __init__(self, message_tokens: int, budget_tokens: int) -> None:
        super().__init__(
            f"the current message needs {message_tokens} tokens but the input budget "
            f"is {budget_tokens} tokens; shorten it or raise the context window"
        )
        self.message_tokens = message_tokens
        self.budget_tokens = budget_tokens


class NoPreviousAnswer(ContextModeError):
    """A follow-up needs the previous answer and the session has none."""

    def __init__(self, intent: str) -> None:
        super().__init__(f"当前没有可用的上文信息 (no previous answer for a {intent!r} follow-up)")
        self.intent = intent


class SessionNotFound(ContextModeError):
    """No session with this id exists for this tenant."""


class SessionErased(SessionNotFound):
    """The session was erased (forget, delete, retention) while a turn was running: the turn
    stores nothing more, so nothing erased comes back."""


class ConflictError(ContextModeError):
    """A compare-and-set write lost against a concurrent writer."""


class StoreError(ContextModeError):
    """The store failed or could not be reached; nothing was half-written."""


class StoreRefused(StoreError):
    """The store refused the data itself (a value or size it cannot hold): retrying the same
    request fails the same way; nothing was written."""


class ModelError(ContextModeError):
    """The chat model failed or answered with something unusable."""


class ModelTimeout(ModelError):
    """The chat model did not answer in time."""


class ModelUnavailable(ModelError):
    """The chat model is unreachable, rate limited (429) or failing (5xx)."""


class ModelPreempted(ModelUnavailable):
    """A background call was cut short so a reply could have its slot (`models.priority`): the
    job tries again later; nothing from the cut call is used."""


class ModelDeferred(ModelPreempted):
    """A background call waited longer than its limit for a free slot (replies held them all):
    a deferral, not a failure; the job lets go and tries again later."""


class ModelRateLimited(ModelUnavailable):
    """The model endpoint answered 429: too many requests for now."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        """Seconds the endpoint asked to wait (its ``retry-after-ms`` or ``retry-after``), when it said."""


class ModelOverloaded(ModelRateLimited):
    """The model endpoint answered 529: overloaded (Anthropic's ``overloaded_error``)."""


class ModelRefused(ModelError):
    """The model endpoint refused, as invalid, a request whose parameters a client chose (the
    memory proxy relays them): the client's error to fix, with the endpoint's own words."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
        """The endpoint's HTTP status (400, 404, 413, 422)."""


class ContextWindowExceeded(ModelError):
    """A model call would take more tokens (prompt plus ``max_tokens``) than the model's context
    window even with the user's text cut to fit; it is not sent."""


class OutputRejected(ModelError):
    """The model answered, but its output is unusable: it fails the schema, or its values do not
    appear in the conversation (the prompt's own examples, empty or markup quotes). Nothing from
    it is stored; a background job ends ``rejected`` with ``reason``, without retries."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"model output rejected: {reason}")
        self.reason = reason


class LockNotAcquired(ContextModeError):
    """Another worker holds this session's job lock."""


class EmptyMessage(InputError):
    """The message is empty or holds only whitespace: there is nothing to answer."""


class TurnNotFound(ContextModeError):
    """No kept trace for that turn of the session (never kept, pruned by retention, or deleted)."""


ErrorTable = tuple[tuple[type[BaseException], type[ContextModeError]], ...]
"""Foreign exception classes and the error each becomes, first match wins (see `translate`)."""


def translate(exc: BaseException, table: ErrorTable, message: str) -> ContextModeError | None:
    """The project error ``exc`` maps to in ``table`` (``message`` as its text), or ``None``
    when no row matches (then the caller re-raises ``exc`` unchanged: a bug, not a failure)."""
    for source, target in table:
        if isinstance(exc, source):
            return target(message)
    return None
