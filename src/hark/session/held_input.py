"""Client input held while an append is denoised off the event loop.

A long append with noise reduction on goes off to be denoised (a ``Denoise`` action), and the
buffer must hear it before anything the client sent after it: later events, binary frames and
media audio wait here, in order and bounded, until the denoised audio is back (``Denoised``)
or the job failed (``DenoiseFailed``). Then the session takes them back, one at a time, from
``release``: a held append may send audio off to be denoised again, and what is left waits on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from hark.protocol.errors import ProtocolError
from hark.protocol.limits import MAX_APPEND_BYTES, MiB
from hark.session.actions import CountDroppedAudio
from hark.session.outbox import Outbox

# What may wait while a session's audio is denoised off the loop: its later client events and
# media audio, in order. Two more appends of the largest size, or a minute of 20 ms frames.
MAX_HELD_INPUTS = 3000
MAX_HELD_BYTES = 2 * MAX_APPEND_BYTES


class Held(NamedTuple):
    """Client input that waits for an append being denoised: an event's text (``event``), a
    binary frame (``binary``) or media audio (``audio``); ``size`` counts toward the bound."""

    kind: str
    data: str | bytes | npt.NDArray[np.int16]
    size: int


class HeldInput:
    """The append being denoised off the loop, and the client input that waits for it."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox
        # The job id of the append being denoised, and its audio as sent.
        self._denoising: tuple[str, npt.NDArray[np.int16]] | None = None
        self._held: deque[Held] = deque()
        self._bytes = 0
        self._audio_refused = False

    @property
    def denoising(self) -> bool:
        """Whether an append is being denoised, so that client input must wait."""
        return self._denoising is not None

    @property
    def releasable(self) -> bool:
        """Whether input waits although no append is being denoised (taking it back stopped
        when an event failed)."""
        return self._denoising is None and bool(self._held)

    def denoise(self, job_id: str, pcm: npt.NDArray[np.int16]) -> None:
        """The append ``pcm`` went off to be denoised as ``job_id``: input waits from now."""
        self._denoising = (job_id, pcm)

    def finish(self, job_id: str) -> npt.NDArray[np.int16] | None:
        """The job ``job_id`` ended: its audio as sent, or None when it is not the append being
        denoised (one from before the session closed or was cleared)."""
        if self._denoising is None or self._denoising[0] != job_id:
            return None
        pcm = self._denoising[1]
        self._denoising = None
        return pcm

    def hold(self, held: Held) -> None:
        """Keep ``held`` until the append being denoised is in the buffer; past the bound, an
        event is refused with an error, and media audio is dropped (counted, one error)."""
        if len(self._held) < MAX_HELD_INPUTS and self._bytes + held.size <= MAX_HELD_BYTES:
            self._held.append(held)
            self._bytes += held.size
            return
        bound = f"at most {MAX_HELD_INPUTS} events or {MAX_HELD_BYTES // MiB} MiB"
        if held.kind == "audio":
            assert isinstance(held.data, np.ndarray)
            self._outbox.act(CountDroppedAudio(len(held.data)))
            if self._audio_refused:
                return
            self._audio_refused = True
        self._outbox.error(
            ProtocolError(
                "Input waits while an earlier append is denoised, and "
                f"{bound} may wait: this {'audio was' if held.kind == 'audio' else 'event was'} "
                "dropped.",
                code="input_backlog_full",
            ),
            None,
        )

    def release(self) -> Iterator[Held]:
        """The input that waited, in order, until it is all taken or another append is sent
        off to be denoised."""
        self._audio_refused = False
        while self._held and self._denoising is None:
            held = self._held.popleft()
            self._bytes -= held.size
            yield held

    def clear(self) -> None:
        """Forget the append being denoised and everything that waits (the session ended)."""
        self._denoising = None
        self._held.clear()
        self._bytes = 0
