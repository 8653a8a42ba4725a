"""Engines: the models behind the session (VAD, ASR, LLM, TTS), behind small streaming interfaces.

An engine knows nothing about sessions or transports. Heavy compute runs off the event loop.
"""
