"""Tests of what clients point the server at: the egress policy and the MCP client."""
