"""processors layer."""
