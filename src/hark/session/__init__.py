"""The session: a sans-I/O Realtime state machine (``core``) and its async driver (``runner``)."""
