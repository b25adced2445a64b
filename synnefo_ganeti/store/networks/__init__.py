"""Networks on backends: their rows and their store."""
