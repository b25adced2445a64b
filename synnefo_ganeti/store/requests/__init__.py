"""Durable requests: rows, claims and batches, names, settling a request when its job ends."""
