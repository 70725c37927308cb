"""Metrics: per-prefix economics (`prefix`)."""
