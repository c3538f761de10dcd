"""The HTTP service: FastAPI app with SSE chat, an OpenAI-compatible memory proxy and session admin.

```python
import uvicorn
from contextmode.service import ServiceSettings, create_app

settings = ServiceSettings.from_env()          # 127.0.0.1:8000 unless told otherwise
uvicorn.run(create_app(settings=settings), host=settings.host, port=settings.port)
```

Needs the ``service`` extra (``pip install 'contextmode-engine[service]'``). See docs/service.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .settings import ServiceSettings

if TYPE_CHECKING:
    from .app import create_app

__all__ = ["ServiceSettings", "create_app"]


def __getattr__(name: str) -> Any:
    # FastAPI is optional: importing the settings must not need it.
    if name == "create_app":
        try:
            from .app import create_app
        except ImportError as exc:
            if (exc.name or "").startswith("contextmode"):
                raise  # our own bug, not a missing extra
            from ..errors import MissingExtra

            raise MissingExtra("service", exc.name or "fastapi") from exc
        return create_app
    raise AttributeError(name)
