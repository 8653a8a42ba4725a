"""The ASR scheduler: the most urgent recognition first, batched, cancelled work never run."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from hark.engines import activity
from hark.engines.asr import Urgency
from hark.engines.asr import scheduler as asr_scheduler
from hark.engines.asr.scheduler import AsrScheduler, SchedulerFullError

# Bounds a hang, never speed.
LIVENESS_S = 30.0


class Model:
    """A stand-in for a model: records each batch, answers each request upper-cased, and
    holds any batch holding ``"hold"`` until ``gate`` is set."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.threads: list[threading.Thread] = []
        self.gate = threading.Event()
        self.holding = threading.Event()
        self.fail_on: str | None = None

    def __call__(self, requests: list[str]) -> list[str]:
        self.batches.append(list(requests))
        self.threads.append(threading.current_thread())
        if "hold" in requests:
            self.holding.set()
            self.gate.wait(LIVENESS_S)
        if self.fail_on in requests:
            raise ValueError(f"broken on {self.fail_on}")
        return [request.upper() for request in requests]


async def hold(scheduler: AsrScheduler[str, str], model: Model) -> asyncio.Task[str]:
    """Occupy the scheduler's worker with a batch that runs until ``model.gate`` is set."""
    task = asyncio.create_task(scheduler.run("hold", Urgency.ANSWER))
    assert await asyncio.to_thread(model.holding.wait, LIVENESS_S)
    return task


async def queue(
    scheduler: AsrScheduler[str, str], requests: list[tuple[str, Urgency]]
) -> dict[str, asyncio.Task[str]]:
    """Start one task per request and return once every one of them waits in the scheduler."""
    tasks = {name: asyncio.create_task(scheduler.run(name, urgency)) for name, urgency in requests}
    await asyncio.sleep(0)
    assert scheduler.waiting == len(requests)
    return tasks


async def test_the_most_urgent_runs_first_then_in_arrival_order() -> None:
    model = Model()
    scheduler: AsrScheduler[str, str] = AsrScheduler(model)
    held = await hold(scheduler, model)
    tasks = await queue(
        scheduler,
        [
            ("guess", Urgency.SPECULATION),
            ("caption1", Urgency.CAPTION),
            ("answer1", Urgency.ANSWER),
            ("caption2", Urgency.CAPTION),
            ("answer2", Urgency.ANSWER),
        ],
    )
    assert scheduler.running == 1
    model.gate.set()
    assert await held == "HOLD"
    assert {name: await task for name, task in tasks.items()} == {
        name: name.upper() for name in tasks
    }
    assert model.batches == [
        ["hold"],
        ["answer1"],
        ["answer2"],
        ["caption1"],
        ["caption2"],
        ["guess"],
    ]


async def test_a_batch_takes_the_most_urgent_up_to_max_batch() -> None:
    model = Model()
    scheduler: AsrScheduler[str, str] = AsrScheduler(model, max_batch=3)
    held = await hold(scheduler, model)
    tasks = await queue(
        scheduler,
        [
            ("a", Urgency.SPECULATION),
            ("b", Urgency.CAPTION),
            ("c", Urgency.ANSWER),
            ("d", Urgency.CAPTION),
            ("e", Urgency.ANSWER),
        ],
    )
    model.gate.set()
    await held
    # Each caller gets its own request's result, wherever it sat in the batch.
    assert {name: await task for name, task in tasks.items()} == {
        name: name.upper() for name in tasks
    }
    assert model.batches == [["hold"], ["c", "e", "b"], ["d", "a"]]


async def test_cancelling_a_waiting_request_frees_its_place_and_it_never_runs() -> None:
    model = Model()
    scheduler: AsrScheduler[str, str] = AsrScheduler(model, max_waiting=2)
    held = await hold(scheduler, model)
    tasks = await queue(scheduler, [("dropped", Urgency.ANSWER), ("kept", Urgency.CAPTION)])
    with pytest.raises(SchedulerFullError):
        await scheduler.run("refused", Urgency.ANSWER)
    tasks["dropped"].cancel()
    with pytest.raises(asyncio.CancelledError):
        await tasks["dropped"]
    assert scheduler.waiting == 1
    late = asyncio.create_task(scheduler.run("late", Urgency.SPECULATION))
    await asyncio.sleep(0)
    assert scheduler.waiting == 2
    model.gate.set()
    await held
    assert await tasks["kept"] == "KEPT"
    assert await late == "LATE"
    assert model.batches == [["hold"], ["kept"], ["late"]]


async def test_a_request_cancelled_while_it_runs_has_its_result_dropped() -> None:
    errors: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    model = Model()
    scheduler: AsrScheduler[str, str] = AsrScheduler(model)
    held = await hold(scheduler, model)
    held.cancel()
    with pytest.raises(asyncio.CancelledError):
        await held
    assert scheduler.running == 1
    model.gate.set()
    # The worker goes on to the next request once the abandoned batch is done.
    assert await scheduler.run("next", Urgency.ANSWER) == "NEXT"
    assert scheduler.running == 0
    assert model.batches == [["hold"], ["next"]]
    assert errors == []


async def test_an_error_reaches_every_request_of_its_batch_and_the_worker_goes_on() -> None:
    model = Model()
    model.fail_on = "bad"
    scheduler: AsrScheduler[str, str] = AsrScheduler(model, max_batch=2)
    held = await hold(scheduler, model)
    tasks = await queue(scheduler, [("bad", Urgency.CAPTION), ("good", Urgency.CAPTION)])
    model.gate.set()
    await held
    for task in tasks.values():
        with pytest.raises(ValueError, match="broken on bad"):
            await task
    assert await scheduler.run("after", Urgency.ANSWER) == "AFTER"


async def test_a_wrong_number_of_results_fails_the_batch() -> None:
    scheduler: AsrScheduler[str, str] = AsrScheduler(lambda requests: [], max_batch=2)
    with pytest.raises(RuntimeError, match="0 results for 1 requests"):
        await scheduler.run("lost", Urgency.ANSWER)


async def test_the_work_runs_on_the_schedulers_own_thread_which_ends_when_idle() -> None:
    model = Model()
    scheduler: AsrScheduler[str, str] = AsrScheduler(model, name="hark-asr-test", idle_s=0.01)
    assert await scheduler.run("one", Urgency.ANSWER) == "ONE"
    first = model.threads[0]
    assert first.name == "hark-asr-test"
    assert first is not threading.main_thread()
    await asyncio.to_thread(first.join, LIVENESS_S)
    assert not first.is_alive()
    assert await scheduler.run("two", Urgency.ANSWER) == "TWO"
    second = model.threads[1]
    assert second is not first
    await asyncio.to_thread(second.join, LIVENESS_S)
    assert not second.is_alive()


async def test_close_fails_the_waiting_requests_and_refuses_new_ones() -> None:
    model = Model()
    scheduler: AsrScheduler[str, str] = AsrScheduler(model)
    held = await hold(scheduler, model)
    tasks = await queue(scheduler, [("waiting", Urgency.ANSWER)])
    scheduler.close()
    with pytest.raises(RuntimeError, match="closed"):
        await tasks["waiting"]
    with pytest.raises(RuntimeError, match="closed"):
        await scheduler.run("new", Urgency.ANSWER)
    model.gate.set()
    # The batch already running completes for its caller.
    assert await held == "HOLD"
    await asyncio.to_thread(model.threads[0].join, LIVENESS_S)
    assert not model.threads[0].is_alive()
    assert model.batches == [["hold"]]


async def test_a_second_worker_runs_while_the_first_is_busy_and_no_more() -> None:
    model = Model()
    scheduler: AsrScheduler[str, str] = AsrScheduler(model, workers=2)
    held = await hold(scheduler, model)
    # The first worker is held: the next request gets a second thread and is answered
    # while the held batch still runs.
    assert await asyncio.wait_for(scheduler.run("caption", Urgency.CAPTION), LIVENESS_S) == (
        "CAPTION"
    )
    assert not held.done()
    assert model.threads[1] is not model.threads[0]
    # Both workers busy (the second held too): a third request waits, no third thread.
    model.holding.clear()
    second = asyncio.create_task(scheduler.run("hold", Urgency.ANSWER))
    assert await asyncio.to_thread(model.holding.wait, LIVENESS_S)
    assert scheduler.running == 2
    third = asyncio.create_task(scheduler.run("late", Urgency.ANSWER))
    await asyncio.sleep(0)
    assert scheduler.waiting == 1
    model.gate.set()
    assert [await held, await second, await third] == ["HOLD", "HOLD", "LATE"]
    assert len({thread.ident for thread in model.threads}) == 2
    scheduler.close()


class Verdict:
    """Another model's call that someone waits for (a turn's verdict), running on a thread of
    its own until ``release``."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(target=activity.marked(self._run, waited_for=True))

    def _run(self) -> None:
        self.inside.set()
        self.release.wait(LIVENESS_S)

    def __enter__(self) -> Verdict:
        self.thread.start()
        assert self.inside.wait(LIVENESS_S)
        return self

    def __exit__(self, *_: object) -> None:
        self.release.set()
        self.thread.join(LIVENESS_S)


async def test_word_times_wait_while_another_model_computes_what_someone_waits_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A bound no run reaches: what lets the times go is the verdict's end alone.
    monkeypatch.setattr(asr_scheduler, "DEFER_LIMIT_S", LIVENESS_S * 10)
    model = Model()
    scheduler: AsrScheduler[str, str] = AsrScheduler(model, max_batch=4)
    held = await hold(scheduler, model)
    with Verdict():
        tasks = await queue(scheduler, [("times", Urgency.TIMES), ("pause", Urgency.DECISION)])
        model.gate.set()
        assert await asyncio.wait_for(held, LIVENESS_S) == "HOLD"
        assert await asyncio.wait_for(tasks["pause"], LIVENESS_S) == "PAUSE"
        # Batched with the pause's words it would have run beside the verdict.
        assert model.batches == [["hold"], ["pause"]]
        assert not tasks["times"].done() and scheduler.waiting == 1
    assert await asyncio.wait_for(tasks["times"], LIVENESS_S) == "TIMES"
    assert model.batches == [["hold"], ["pause"], ["times"]]
    scheduler.close()


async def test_word_times_wait_no_longer_than_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(asr_scheduler, "DEFER_LIMIT_S", 0.0)
    model = Model()
    scheduler: AsrScheduler[str, str] = AsrScheduler(model, max_batch=4)
    with Verdict():
        assert await asyncio.wait_for(scheduler.run("times", Urgency.TIMES), LIVENESS_S) == "TIMES"
    scheduler.close()


async def test_word_times_run_at_once_when_nobody_waits_and_a_cancelled_one_never() -> None:
    model = Model()
    scheduler: AsrScheduler[str, str] = AsrScheduler(model, max_batch=4)
    held = await hold(scheduler, model)
    tasks = await queue(scheduler, [("times", Urgency.TIMES), ("late", Urgency.TIMES)])
    tasks["late"].cancel()
    # Gone once its task has run its cancellation, not before: the worker must not be let
    # go first.
    with pytest.raises(asyncio.CancelledError):
        await tasks["late"]
    assert scheduler.waiting == 1
    model.gate.set()
    assert await asyncio.wait_for(held, LIVENESS_S) == "HOLD"
    assert await asyncio.wait_for(tasks["times"], LIVENESS_S) == "TIMES"
    assert model.batches == [["hold"], ["times"]]
    scheduler.close()


async def test_close_fails_deferred_word_times(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(asr_scheduler, "DEFER_LIMIT_S", LIVENESS_S * 10)
    model = Model()
    scheduler: AsrScheduler[str, str] = AsrScheduler(model)
    with Verdict():
        task = asyncio.create_task(scheduler.run("times", Urgency.TIMES))
        await asyncio.sleep(0)
        scheduler.close()
        with pytest.raises(RuntimeError, match="closed"):
            await asyncio.wait_for(task, LIVENESS_S)
    assert model.batches == []
