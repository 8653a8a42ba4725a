"""Limits the Realtime API sets: OpenAI's 15 MiB per event, the WebSocket frame that carries
such an event, and the 60 minutes a session lasts."""

from __future__ import annotations

MiB = 1024 * 1024
# The one definition of the append limit ("15 MiB per event"): the base64 text of an
# append's audio. The session refuses a longer one; the README states it.
MAX_APPEND_BYTES = 15 * MiB
# The largest append the session accepts and room for the JSON around it: an append just
# over the session's limit still reaches the session, which answers with an error event and
# goes on; a larger frame closes the connection with 1009 (message too big). A forwarded
# connection is held to the same frame size.
MAX_MESSAGE_BYTES = MAX_APPEND_BYTES + MiB
# How long a session lasts (OpenAI's 60 minutes): then the client gets ``session_expired``
# and the session ends. The core keeps it; transports and the server pass it on.
SESSION_LIMIT_S = 60 * 60
