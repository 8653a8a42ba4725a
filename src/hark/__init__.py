"""hark: a self-hosted, drop-in OpenAI Realtime API server for real-time voice AI."""

__version__ = "0.1.0"
