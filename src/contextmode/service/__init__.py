"""service layer."""
