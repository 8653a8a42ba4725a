"""Talk to hark with the official `openai` SDK.

Microphone and speakers (needs PortAudio's `sounddevice`):
    uv run --with sounddevice python examples/voice_chat.py

From a WAV file (16-bit mono, any rate), writing the reply to another WAV file:
    uv run python examples/voice_chat.py --wav question.wav --out reply.wav

Nothing here is specific to hark: point it at OpenAI by changing --base-url and the key.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
import wave
from typing import Any

import numpy as np
from openai import AsyncOpenAI

RATE = 24000
CHUNK = RATE // 50  # 20 ms


def read_wav(path: str) -> np.ndarray:
    """A mono 16-bit WAV as int16 samples at 24 kHz."""
    with wave.open(path) as wav:
        if wav.getsampwidth() != 2:
            sys.exit(f"{path}: expected 16-bit samples")
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), "<i2").astype(np.float32)
        pcm = pcm.reshape(-1, wav.getnchannels()).mean(axis=1)
        rate = wav.getframerate()
    if rate != RATE:
        positions = np.arange(int(len(pcm) * RATE / rate)) * rate / RATE
        pcm = np.interp(positions, np.arange(len(pcm)), pcm)
    return pcm.astype(np.int16)


def write_wav(path: str, pcm: np.ndarray) -> None:
    """Save int16 samples at 24 kHz."""
    with wave.open(path, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        wav.writeframes(pcm.astype("<i2").tobytes())


class Speaker:
    """Plays reply audio and knows how much of it was heard, for barge-in."""

    def __init__(self) -> None:
        import sounddevice  # type: ignore[import-not-found]

        self._pending = np.zeros(0, np.int16)
        self.played = 0
        self._stream = sounddevice.OutputStream(
            samplerate=RATE, channels=1, dtype="int16", callback=self._callback
        )
        self._stream.start()

    def _callback(self, out: Any, frames: int, _time: Any, _status: Any) -> None:
        chunk, self._pending = self._pending[:frames], self._pending[frames:]
        out[: len(chunk), 0] = chunk
        out[len(chunk) :, 0] = 0
        self.played += len(chunk)

    def add(self, pcm: np.ndarray) -> None:
        self._pending = np.concatenate((self._pending, pcm))

    def stop(self) -> None:
        """Drop what has not been played yet."""
        self._pending = np.zeros(0, np.int16)


async def microphone(conn: Any) -> None:
    """Stream the default microphone in 20 ms chunks."""
    import sounddevice

    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    def callback(data: Any, _frames: int, _time: Any, _status: Any) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, bytes(data))

    with sounddevice.RawInputStream(
        samplerate=RATE, channels=1, dtype="int16", blocksize=CHUNK, callback=callback
    ):
        while True:
            await conn.input_audio_buffer.append(audio=base64.b64encode(await queue.get()).decode())


async def from_file(conn: Any, pcm: np.ndarray) -> None:
    """Stream a recording in real time, then keep the line open with silence."""
    silence = np.zeros(CHUNK, np.int16)
    padded = np.concatenate((pcm, np.zeros(RATE // 2, np.int16)))
    for i in range(0, len(padded), CHUNK):
        chunk = padded[i : i + CHUNK].astype("<i2").tobytes()
        await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
        await asyncio.sleep(0.02)
    while True:
        await conn.input_audio_buffer.append(audio=base64.b64encode(silence.tobytes()).decode())
        await asyncio.sleep(0.02)


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "local"))
    parser.add_argument("--model", default="gpt-realtime")
    parser.add_argument("--wav", help="speak this WAV file instead of using the microphone")
    parser.add_argument("--out", default="reply.wav", help="with --wav: where to save the reply")
    args = parser.parse_args()

    client = AsyncOpenAI(
        api_key=args.api_key,
        base_url=args.base_url,
        websocket_base_url=args.base_url.replace("http", "ws", 1),
    )
    async with client.realtime.connect(model=args.model) as conn:
        await conn.session.update(
            session={
                "type": "realtime",
                "audio": {
                    "input": {
                        "transcription": {"model": "whisper-1"},
                        "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                    }
                },
            }
        )
        speaker = None if args.wav else Speaker()
        source = from_file(conn, read_wav(args.wav)) if args.wav else microphone(conn)
        sender = asyncio.create_task(source)
        reply: list[np.ndarray] = []
        item_id, item_start = None, 0
        try:
            async for event in conn:
                if event.type == "conversation.item.input_audio_transcription.completed":
                    print(f"you:  {event.transcript}")
                elif event.type == "response.output_audio.delta":
                    pcm = np.frombuffer(base64.b64decode(event.delta), "<i2").astype(np.int16)
                    if event.item_id != item_id and speaker is not None:
                        item_id, item_start = event.item_id, speaker.played
                    reply.append(pcm)
                    if speaker is not None:
                        speaker.add(pcm)
                elif event.type == "response.output_audio_transcript.done":
                    print(f"hark: {event.transcript}")
                elif event.type == "input_audio_buffer.speech_started" and speaker is not None:
                    # Barge-in: stop playing and tell the server what was actually heard.
                    speaker.stop()
                    if item_id is not None:
                        heard_ms = (speaker.played - item_start) * 1000 // RATE
                        await conn.conversation.item.truncate(
                            item_id=item_id, content_index=0, audio_end_ms=max(0, heard_ms)
                        )
                        item_id = None
                elif event.type == "error":
                    print(f"error: {event.error.message}", file=sys.stderr)
                elif event.type == "response.done" and args.wav:
                    break
        finally:
            sender.cancel()
    if args.wav:
        write_wav(args.out, np.concatenate(reply) if reply else np.zeros(0, np.int16))
        print(f"reply saved to {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
