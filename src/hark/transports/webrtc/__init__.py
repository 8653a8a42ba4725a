"""The WebRTC transport: browsers and SDKs call hark as they call OpenAI, over one UDP port.

``POST /v1/realtime/calls`` answers an SDP offer (``calls.Calls``), each call runs one
session (``call.Call``): events on the ``oai-events`` data channel, the microphone as an
Opus track in (``input_audio``), the reply as an Opus track out, paced and cut on barge-in
by the server (``playout``). ICE, DTLS, SRTP and SCTP are aiortc's; all calls of a worker
share one UDP socket (``udp_mux``), which aiortc's ICE gathers on (``ice``).
"""

from hark.transports.webrtc.call import Call
from hark.transports.webrtc.calls import Calls
from hark.transports.webrtc.playout import PlayoutTrack
from hark.transports.webrtc.sdp import OfferError
from hark.transports.webrtc.udp_mux import UdpMux

__all__ = ["Call", "Calls", "OfferError", "PlayoutTrack", "UdpMux"]
