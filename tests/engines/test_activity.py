"""The process-wide count of model calls computing now, and of those someone waits for."""

from __future__ import annotations

import threading

import pytest

from hark.engines import activity
from hark.engines.activity import computing, computing_now, marked

# Bounds a hang, never speed.
LIVENESS_S = 5.0


def test_calls_are_counted_while_they_run_in_any_thread() -> None:
    assert computing_now() == 0
    inside = threading.Event()
    release = threading.Event()

    def model_call() -> str:
        inside.set()
        release.wait(5)
        return "done"

    results: list[str] = []
    thread = threading.Thread(target=lambda: results.append(marked(model_call)()))
    thread.start()
    assert inside.wait(5)
    with computing():
        assert computing_now() == 2
    assert computing_now() == 1
    release.set()
    thread.join(5)
    assert results == ["done"]
    assert computing_now() == 0


def test_a_failing_call_is_no_longer_counted() -> None:
    def broken() -> None:
        raise RuntimeError("model crashed")

    with pytest.raises(RuntimeError):
        marked(broken)()
    assert computing_now() == 0


def test_a_call_spreads_alone_or_beside_the_one_reply_it_voices() -> None:
    # The call itself is one of the computing calls.
    assert activity.spreads(computing=1, waited_for=0)
    assert activity.spreads(computing=1, waited_for=1)
    # Another model computes, or another session waits for the LLM: stay narrow.
    assert not activity.spreads(computing=2, waited_for=0)
    assert not activity.spreads(computing=1, waited_for=2)
    assert not activity.spreads(computing=3, waited_for=3)


def test_engines_publish_what_they_have_waited_for_and_only_changes_count() -> None:
    llm, other = activity.Waited(), activity.Waited()
    llm.set(2)
    llm.set(2)
    other.set(1)
    assert activity.waited_for_now() == 3
    llm.set(0)
    other.set(0)
    assert activity.waited_for_now() == 0


def test_a_call_someone_waits_for_is_counted_while_it_runs_and_after_a_failure_no_more() -> None:
    inside = threading.Event()
    release = threading.Event()

    def verdict() -> float:
        inside.set()
        release.wait(LIVENESS_S)
        return 0.9

    assert not activity.someone_waits_now()
    results: list[float] = []
    thread = threading.Thread(target=lambda: results.append(marked(verdict, waited_for=True)()))
    thread.start()
    assert inside.wait(LIVENESS_S)
    assert activity.waited_for_now() == 1 and computing_now() == 1
    assert activity.someone_waits_now()
    release.set()
    thread.join(LIVENESS_S)
    assert results == [0.9]
    assert activity.waited_for_now() == 0 and not activity.someone_waits_now()

    def broken() -> None:
        raise RuntimeError("model crashed")

    with pytest.raises(RuntimeError):
        marked(broken, waited_for=True)()
    assert activity.waited_for_now() == 0 and computing_now() == 0
    # An urgent call is waited for too.
    with activity.urgent():
        assert activity.someone_waits_now()
    assert not activity.someone_waits_now()


class Holder:
    """A thread holding off as the LLM's steps do; counts how often it looked at ``stop``
    (once on entering, again at every wake-up) and says when it has ended."""

    def __init__(self, limit_s: float) -> None:
        self.stop = False
        self._cond = threading.Condition()
        self.checks = 0

        def stopped() -> bool:
            with self._cond:
                self.checks += 1
                self._cond.notify_all()
            return self.stop

        self.thread = threading.Thread(target=activity.hold_off, args=(limit_s, stopped))
        self.thread.start()

    def checked(self, times: int) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.checks >= times, LIVENESS_S)

    def ended(self) -> bool:
        self.thread.join(LIVENESS_S)
        return not self.thread.is_alive()


def test_holding_off_ends_with_the_urgent_call() -> None:
    assert activity.urgent_now() == 0
    # Nothing urgent runs: no wait at all, however long the bound.
    activity.hold_off(3600.0, lambda: False)
    with activity.urgent():
        assert activity.urgent_now() == 1
        holder = Holder(3600.0)
        assert holder.checked(1)
        # Woken while the call still runs, it holds on.
        activity.wake_holders()
        assert holder.checked(2)
        assert holder.thread.is_alive()
    assert activity.urgent_now() == 0
    assert holder.ended()


def test_holding_off_ends_at_the_bound_while_the_call_still_runs() -> None:
    with activity.urgent():
        holder = Holder(0.01)
        assert holder.ended()
        assert activity.urgent_now() == 1


def test_holding_off_ends_when_more_pressing_work_comes() -> None:
    with activity.urgent():
        holder = Holder(3600.0)
        assert holder.checked(1)
        holder.stop = True
        activity.wake_holders()
        assert holder.ended()
        assert activity.urgent_now() == 1


def test_a_failing_urgent_call_is_no_longer_counted() -> None:
    with pytest.raises(RuntimeError), activity.urgent():
        raise RuntimeError("model crashed")
    assert activity.urgent_now() == 0
