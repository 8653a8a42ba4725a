"""Checks on a client's SDP offer before aiortc sees it.

aiortc's parser accepts nearly anything (an empty text is an offer without media) and fails
later with assorted exceptions, so an offer is checked here first and every failure becomes
one ``OfferError`` with a message for the client.
"""

from __future__ import annotations

from aiortc import sdp

# A browser's offer with audio and a data channel is about 5 KB.
MAX_OFFER_BYTES = 64 * 1024
_MDNS_SUFFIX = ".local"


class OfferError(ValueError):
    """The offer is not one hark can answer; the message says why."""


def check_offer(text: str) -> tuple[str, list[str]]:
    """Validate an offer; returns it ready for ``setRemoteDescription`` and its media kinds.

    mDNS host candidates (``….local``, what browsers send by default) are removed:
    resolving them would need multicast, and the client's own connectivity checks reveal
    its address anyway (as a peer-reflexive candidate). Audio must offer Opus. Raises
    ``OfferError``.
    """
    if len(text.encode("utf-8", "surrogatepass")) > MAX_OFFER_BYTES:
        raise OfferError(f"The SDP offer is larger than {MAX_OFFER_BYTES} bytes.")
    if not text.lstrip().startswith("v=0"):
        raise OfferError("The request body is not an SDP offer (it must start with 'v=0').")
    text = strip_mdns_candidates(text)
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


def strip_mdns_candidates(text: str) -> str:
    """``text`` without the ``a=candidate`` lines whose address is an mDNS name."""
    lines = text.splitlines(keepends=True)
    kept = [line for line in lines if not _is_mdns_candidate(line)]
    return "".join(kept)


def _is_mdns_candidate(line: str) -> bool:
    if not line.startswith("a=candidate:"):
        return False
    fields = line.split()
    # a=candidate:foundation component transport priority ADDRESS port typ …
    return len(fields) > 4 and fields[4].lower().endswith(_MDNS_SUFFIX)


def _reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__
