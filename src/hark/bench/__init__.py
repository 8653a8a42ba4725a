"""Benchmarks: the `hark bench` commands, each a client that measures a running server."""
