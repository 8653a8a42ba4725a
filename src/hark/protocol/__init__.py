"""The Realtime protocol (GA): every client event, server event, item and config, typed."""
