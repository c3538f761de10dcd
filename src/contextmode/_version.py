"""The package version, in a module of its own: code inside the package reads it without
importing the package's front (`contextmode/__init__.py` imports every layer)."""

__version__ = "0.1.0"
