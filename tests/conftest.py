"""Test-wide settings: nothing may talk to a real model by accident; state stays in tmp."""

from __future__ import annotations

import os
import tempfile

# Like pydantic-ai's ALLOW_MODEL_REQUESTS = False: only loopback model URLs (the stub server).
os.environ.setdefault("CONTEXTMODE_ALLOW_MODEL_REQUESTS", "0")
# Never write to the developer's ~/.contextmode from a test.
os.environ.setdefault("CONTEXTMODE_HOME", tempfile.mkdtemp(prefix="contextmode-test-home-"))
