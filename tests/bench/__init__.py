"""Tests of the `hark bench` commands."""
