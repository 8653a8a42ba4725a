"""Tests of the HTTP server, authentication, configuration and the CLI."""
