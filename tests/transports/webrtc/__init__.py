"""Tests of WebRTC calls: ICE, the UDP mux, the SDP, the audio path and the calls."""
