"""Instances and their tasks: rows, a job's outcome applied to them, observed state, nodes."""
