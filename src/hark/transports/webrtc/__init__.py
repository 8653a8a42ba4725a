"""The WebRTC transport: browsers and SDKs call hark as they call OpenAI, over one UDP port.

``POST /v1/realtime/calls`` answers an SDP offer (``calls.Calls``), each call runs one
session (``call.Call``): events on the ``oai-events`` data channel, the microphone as an
Opus stream in (``input_audio``), the reply as an Opus stream out, paced on the worker's
one ``hark.transports.ticker.PlayoutTicker`` and cut on barge-in by the server
(``playout``). ICE, DTLS, the SRTP keys and SCTP are aiortc's; the audio RTP is hark's own
(``rtp_audio``, libopus through ``opus``). All calls of a worker share one UDP socket
(``udp_mux``), which aiortc's ICE gathers on (``ice``).
"""

from hark.transports.webrtc.call import Call
from hark.transports.webrtc.calls import Calls
from hark.transports.webrtc.playout import PlayoutTrack
from hark.transports.webrtc.sdp import OfferError
from hark.transports.webrtc.udp_mux import UdpMux

__all__ = ["Call", "Calls", "OfferError", "PlayoutTrack", "UdpMux"]
