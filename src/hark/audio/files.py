"""Audio files for OpenAI's audio API: decoding an uploaded file, and encoding speech as a
stream in the formats ``/v1/audio/speech`` offers.

PCM and WAV are written here (WAV with the "unknown length" sizes streaming servers use,
as OpenAI's own streamed WAV does); MP3, Opus (in Ogg), AAC (ADTS) and FLAC go through
FFmpeg's encoders in PyAV, which aiortc already brings. Uploaded files of any container
and codec FFmpeg knows (WAV, MP3, FLAC, Ogg, WebM, MP4/M4A) are decoded the same way.
"""

from __future__ import annotations

import functools
import io
import struct
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import av.container

SpeechFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
CONTENT_TYPES: dict[SpeechFormat, str] = {
    "pcm": "audio/pcm",
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
}
# (container, encoder) per compressed format.
_CODECS: dict[SpeechFormat, tuple[str, str]] = {
    "mp3": ("mp3", "libmp3lame"),
    "opus": ("ogg", "libopus"),
    "aac": ("adts", "aac"),
    "flac": ("flac", "flac"),
}
# Ogg collects a second of packets per page by default: a listener would wait that long.
_OGG_PAGE_MICROSECONDS = 100_000
# A RIFF/data size of 0xFFFFFFFF: the length is unknown while the audio streams.
_UNKNOWN_SIZE = 0xFFFFFFFF


class AudioFileError(ValueError):
    """An uploaded file that holds no decodable audio (or too much of it)."""


class SpeechEncoder(Protocol):
    """Turns a stream of int16 mono chunks into the bytes of one audio file, as it goes.

    ``blocking``: encoding takes real CPU time (a compressing codec), so it belongs off the
    event loop.
    """

    blocking: bool

    def encode(self, pcm: npt.NDArray[np.int16]) -> bytes:
        """The file's next bytes for ``pcm`` (possibly none yet)."""
        ...

    def finish(self) -> bytes:
        """The file's last bytes."""
        ...


def missing_speech_encoder(response_format: SpeechFormat) -> str | None:
    """The FFmpeg encoder ``response_format`` needs when this build lacks it, else None (an
    image built without GPL components has no MP3 encoder: LAME is not in its FFmpeg)."""
    if response_format not in _CODECS:
        return None
    codec = _CODECS[response_format][1]
    return None if _has_encoder(codec) else codec


@functools.cache
def _has_encoder(codec: str) -> bool:
    import av

    try:
        av.Codec(codec, "w")
    except (ValueError, av.FFmpegError):
        return False
    return True


def speech_encoder(response_format: SpeechFormat, rate: int) -> SpeechEncoder:
    """An encoder of mono int16 audio at ``rate`` Hz into ``response_format``."""
    if response_format == "pcm":
        return _PcmEncoder()
    if response_format == "wav":
        return _WavEncoder(rate)
    container, codec = _CODECS[response_format]
    return _FfmpegEncoder(container, codec, rate)


def wav_header(rate: int, *, frames: int | None = None) -> bytes:
    """The 44-byte header of 16-bit mono PCM WAV; ``frames`` None streams (unknown length)."""
    data_size = _UNKNOWN_SIZE if frames is None else frames * 2
    riff_size = _UNKNOWN_SIZE if frames is None else 36 + data_size
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        riff_size,
        b"WAVE",
        b"fmt ",
        16,
        1,  # PCM
        1,  # mono
        rate,
        rate * 2,
        2,
        16,
        b"data",
        data_size,
    )


class _PcmEncoder:
    blocking = False

    def encode(self, pcm: npt.NDArray[np.int16]) -> bytes:
        return pcm.astype("<i2", copy=False).tobytes()

    def finish(self) -> bytes:
        return b""


class _WavEncoder:
    blocking = False

    def __init__(self, rate: int) -> None:
        self._header: bytes | None = wav_header(rate)

    def encode(self, pcm: npt.NDArray[np.int16]) -> bytes:
        head, self._header = self._header or b"", None
        return head + pcm.astype("<i2", copy=False).tobytes()

    def finish(self) -> bytes:
        # A stream with no audio at all is still a valid (empty) file.
        head, self._header = self._header or b"", None
        return head


class _Sink(io.RawIOBase):
    """Where the muxer writes; taken out after every packet. Not seekable, so muxers that
    would go back to patch a header (FLAC's) leave it as first written."""

    def __init__(self) -> None:
        self._data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self._data += data
        return len(data)

    def take(self) -> bytes:
        data = bytes(self._data)
        self._data.clear()
        return data


class _FfmpegEncoder:
    blocking = True

    def __init__(self, container: str, codec: str, rate: int) -> None:
        import av

        self._rate = rate
        self._sink = _Sink()
        options = {"page_duration": str(_OGG_PAGE_MICROSECONDS)} if container == "ogg" else {}
        self._container: av.container.OutputContainer = av.open(
            self._sink, mode="w", format=container, options=options
        )
        # Opus runs at 48 kHz; PyAV resamples the frames to what the encoder takes.
        stream = self._container.add_stream(codec, rate=48000 if codec == "libopus" else rate)
        if not isinstance(stream, av.AudioStream):
            raise TypeError(f"{codec} is not an audio encoder")
        stream.layout = "mono"
        self._stream = stream
        self._pts = 0

    def encode(self, pcm: npt.NDArray[np.int16]) -> bytes:
        import av

        if pcm.size == 0:
            return b""
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(pcm, dtype=np.int16)[np.newaxis], format="s16", layout="mono"
        )
        frame.sample_rate = self._rate
        frame.pts = self._pts
        self._pts += pcm.size
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        return self._sink.take()

    def finish(self) -> bytes:
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        return self._sink.take()


def decode_file(data: bytes, rate: int, *, max_seconds: float) -> npt.NDArray[np.float32]:
    """The first audio stream of a file, as mono float32 at ``rate`` Hz.

    Raises ``AudioFileError`` when the file holds no decodable audio or more than
    ``max_seconds`` of it.
    """
    import av

    limit = int(max_seconds * rate)
    chunks: list[npt.NDArray[np.float32]] = []
    total = 0
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise AudioFileError("The file has no audio stream.")
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    samples = out.to_ndarray().reshape(-1).astype(np.float32, copy=False)
                    total += samples.size
                    if total > limit:
                        raise AudioFileError(
                            f"The audio is longer than {max_seconds / 60:g} minutes."
                        )
                    chunks.append(samples)
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1).astype(np.float32, copy=False))
    except av.FFmpegError as exc:
        raise AudioFileError(f"The audio file could not be decoded ({exc.strerror}).") from None
    if not chunks:
        return np.zeros(0, np.float32)
    return np.concatenate(chunks)
