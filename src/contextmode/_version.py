"""The package version, on the ground floor so that any layer may read it (the package's
``__init__`` imports every layer)."""

__version__ = "0.1.0"
