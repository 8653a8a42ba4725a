"""Transports: carry a session's events and audio between a client and the session core."""
