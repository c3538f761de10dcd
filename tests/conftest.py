"""Test-wide settings: nothing may talk to a real model by accident; state stays in tmp."""

from __future__ import annotations

import os
import tempfile

# CI never skips silently: under a truthy CI every skip is a failure (contextmode.testing.ci).
pytest_plugins = ["pytester", "contextmode.testing.ci"]

# Like pydantic-ai's ALLOW_MODEL_REQUESTS = False: only loopback model URLs (the stub server).
os.environ.setdefault("CONTEXTMODE_ALLOW_MODEL_REQUESTS", "0")
# Never write to the developer's ~/.contextmode from a test.
os.environ.setdefault("CONTEXTMODE_HOME", tempfile.mkdtemp(prefix="contextmode-test-home-"))

# Property tests check behaviour, not speed: on a loaded 2-core machine Hypothesis's own
# timing checks (a per-example deadline, "too slow" input generation) would fail at random.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "contextmode", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("contextmode")
