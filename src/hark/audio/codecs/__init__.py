"""Audio codecs, one module each: G.711 (``g711``) and Opus (``opus``).

They sit in the audio layer, below the session, because the session itself speaks G.711
(the Realtime ``audio/pcmu`` and ``audio/pcma`` formats); every call transport takes its
codecs from here.
"""
