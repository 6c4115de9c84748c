"""Metrics (metrics.jsonl is the source of truth), samples, console output, health warnings and plots."""
