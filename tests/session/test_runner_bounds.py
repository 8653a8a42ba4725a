"""What the runner keeps per session stays bounded when an engine stops answering."""

from __future__ import annotations

import json
from base64 import b64encode
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from hark.config import Settings
from hark.engines.registry import build_engines
from hark.session.runner import MAX_VAD_WAITING_RUNS, SessionRunner


class SilentVad:
    """A VAD that takes every chunk and answers none until the test answers them."""

    chunk_ms = 32

    def __init__(self) -> None:
        self.pushed: list[int] = []
        self.on_result: Callable[[float, int], None] | None = None

    def open_stream(
        self,
        on_result: Callable[[float, int], None],
        on_missed: Callable[[int, str | None], None] | None = None,
    ) -> SilentVad:
        self.on_result = on_result
        return self

    async def warmup(self) -> None:
        return None

    def push(self, chunk: npt.NDArray[np.int16] | npt.NDArray[np.float32], epoch: int) -> None:
        self.pushed.append(epoch)

    def deliver_ready(self) -> None:
        return None

    def close(self) -> None:
        return None


async def test_a_vad_that_stops_answering_leaves_a_bounded_record_of_the_chunks_waiting() -> None:
    engines = build_engines(Settings(engines="fake"))
    vad = SilentVad()
    engines.vad = vad
    clock = [100.0]
    runner = SessionRunner(engines, model="m", monotonic=lambda: clock[0])
    arrivals: list[float] = []
    runner.metrics.vad_chunk = lambda arrived, now=None: arrivals.append(arrived)  # type: ignore[method-assign]
    await runner.start()
    # Two chunks an append, each append a second later than the last: one run each.
    audio = b64encode(np.full(2 * 768, 3000, "<i2").tobytes()).decode()
    appends = 3 * MAX_VAD_WAITING_RUNS
    for _ in range(appends):
        clock[0] += 1.0
        runner.receive_text(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
    assert len(vad.pushed) == 2 * appends
    assert len(runner._vad_waiting) == MAX_VAD_WAITING_RUNS
    # The VAD answers at last: every answer takes its own chunk's place, in order, the ones
    # past the bound with the newest run's arrival, and none is left over or missing.
    assert vad.on_result is not None
    for epoch in vad.pushed:
        vad.on_result(0.0, epoch)
    assert len(runner._vad_waiting) == 0
    expected = [100.0 + i // 2 + 1 for i in range(2 * MAX_VAD_WAITING_RUNS)]
    assert arrivals[: len(expected)] == expected
    assert arrivals[len(expected) :] == [expected[-1]] * (len(arrivals) - len(expected))
    assert len(arrivals) == 2 * appends
    await runner.close()
    await engines.aclose()
