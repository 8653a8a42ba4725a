"""hark as one service over many processes and hosts: shared state, the worker registry,
routing between workers, placement and drain."""
