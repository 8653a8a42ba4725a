"""Observability: per-turn timings, Prometheus metrics, traces."""
