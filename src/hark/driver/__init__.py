"""The I/O side of a session: runs the sans-I/O core (``hark.session``) on the event loop.

The runner takes a transport's inputs and carries out the core's actions; the engine work,
the generation of replies, the outgoing backlog and the per-response timings each have a
module of their own.
"""
