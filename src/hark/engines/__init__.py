"""Engines: the models behind the session (VAD, ASR, LLM, TTS), each behind a small streaming interface.

An engine knows nothing about sessions or transports. Heavy compute runs off the event loop.
"""
