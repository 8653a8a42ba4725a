"""The edge: one public UDP port for the media of a whole fleet (``hark relay``).

A relay reads the routing hint in the server ufrag of a client's first STUN binding
request (``route_hint``), forwards the packet to the worker that issued the answer, and
from then on forwards by the client's address (``flows``), in a small encapsulation that
tells the worker the client's real address (``framing``). See docs/edge.md.
"""
