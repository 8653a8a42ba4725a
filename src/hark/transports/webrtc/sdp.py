"""Checks on a client's SDP offer before aiortc sees it.

aiortc's parser accepts nearly anything (an empty text is an offer without media) and fails
later with assorted exceptions, so an offer is checked here first and every failure becomes
one ``OfferError`` with a message for the client.
"""

from __future__ import annotations

from aiortc import sdp

from hark.transports.webrtc.candidates import CandidatePolicy, TooManyCandidates

# A browser's offer with audio and a data channel is about 5 KB.
MAX_OFFER_BYTES = 64 * 1024


class OfferError(ValueError):
    """The offer is not one hark can answer; the message says why."""


def check_offer(text: str, candidates: CandidatePolicy) -> tuple[str, list[str]]:
    """Validate an offer; returns it ready for ``setRemoteDescription`` and its media kinds.

    Its ICE candidates are screened by ``candidates`` (``hark.transports.webrtc.candidates``:
    too many is an error; those outside policy, mDNS names among them, are removed). Audio
    must offer Opus. Raises ``OfferError``.
    """
    if len(text.encode("utf-8", "surrogatepass")) > MAX_OFFER_BYTES:
        raise OfferError(f"The SDP offer is larger than {MAX_OFFER_BYTES} bytes.")
    if not text.lstrip().startswith("v=0"):
        raise OfferError("The request body is not an SDP offer (it must start with 'v=0').")
    try:
        text = candidates.screen(text)
    except TooManyCandidates as exc:
        raise OfferError(str(exc)) from None
    try:
        description = sdp.SessionDescription.parse(text)
    except Exception as exc:
        raise OfferError(f"The SDP offer could not be parsed: {_reason(exc)}") from None
    kinds = [media.kind for media in description.media]
    if "audio" not in kinds and "application" not in kinds:
        raise OfferError("The SDP offer has neither an audio track nor a data channel.")
    for media in description.media:
        if media.kind not in ("audio", "application"):
            raise OfferError(f"The SDP offer has an unsupported media section {media.kind!r}.")
        if media.ice is None or not media.ice.usernameFragment or not media.ice.password:
            raise OfferError("The SDP offer lacks ICE credentials (a=ice-ufrag, a=ice-pwd).")
        if media.dtls is None or not media.dtls.fingerprints:
            raise OfferError("The SDP offer lacks a DTLS fingerprint (a=fingerprint).")
        if media.kind == "audio" and not any(
            codec.mimeType.lower() == "audio/opus" for codec in media.rtp.codecs
        ):
            raise OfferError("The SDP offer's audio must include the Opus codec.")
    return text, kinds


def _reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__
