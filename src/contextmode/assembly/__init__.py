"""assembly layer."""
