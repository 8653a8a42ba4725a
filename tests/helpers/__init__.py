"""Small helpers the tests share, each written once.

- ``tests.helpers.net``: a free TCP port, an Authorization header.
- ``tests.helpers.streams``: collecting an async stream, picking events by type.
- ``tests.helpers.llm``: a language model's reply, collected, and its text.
- ``tests.helpers.audio``: test signals (a sine tone).
- ``tests.helpers.text``: a transcript's words, for comparing what was heard.

Bigger shared parts (servers, Redis, speech, SIP peers) and fixtures (``tests/conftest.py``)
keep their own modules under ``tests/``; this package is for the few-line functions that
tests used to copy.
"""
