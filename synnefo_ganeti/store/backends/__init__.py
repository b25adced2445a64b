"""Backends: their rows, nodes and events, and their repository."""
