"""The HTTP server: the Realtime API endpoints, authentication and health checks."""
