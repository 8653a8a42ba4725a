"""Tools that hark runs for the model itself (remote MCP servers), outside the session core."""
