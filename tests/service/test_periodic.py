"""PeriodicRunner on fake time: the loop runs in the test's thread (`run()`), the injected wait
records each pause and advances the fake clock, so nothing here sleeps."""

from __future__ import annotations

import logging
import threading

import pytest

from extender.periodic import PeriodicRunner, fixed_delay, fixed_rate


class FakeTime:
    """A clock and a wait on it; stops the runner after `rounds` waits."""

    def __init__(self, rounds: int) -> None:
        self.now, self.rounds = 0.0, rounds
        self.waits: list[float] = []
        self.runner: PeriodicRunner | None = None

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        if len(self.waits) >= self.rounds and self.runner is not None:
            self.runner.stop()
        return False


def runner_on(fake: FakeTime, step: object, delay: object, **kw: object) -> PeriodicRunner:
    r = PeriodicRunner("t", step, delay, clock=fake.clock, wait=fake.wait, **kw)  # type: ignore[arg-type]
    fake.runner = r
    return r


def test_first_step_at_once_then_a_fixed_pause_after_each() -> None:
    fake = FakeTime(rounds=3)
    at: list[float] = []

    def step() -> None:
        at.append(fake.now)
        fake.now += 2.0  # the step takes 2 s

    runner_on(fake, step, 5.0).run()
    assert at == [0.0, 7.0, 14.0]  # a pause of 5 s after each 2 s step
    assert fake.waits == [5.0, 5.0, 5.0]


def test_fixed_rate_subtracts_the_step_and_never_waits_negative() -> None:
    fake = FakeTime(rounds=3)
    took = iter([1.0, 7.0, 0.0])

    def step() -> None:
        fake.now += next(took)

    runner_on(fake, step, fixed_rate(5.0)).run()
    assert fake.waits == [4.0, 0.0, 5.0]  # an overrun step is followed at once


def test_a_delay_callable_gives_back_off() -> None:
    fake = FakeTime(rounds=4)
    backoff = [1.0]

    def delay(_took: float) -> float:
        backoff[0] *= 2
        return backoff[0]

    r = runner_on(fake, lambda: None, delay)
    r.run()
    assert fake.waits == [2.0, 4.0, 8.0, 16.0] and r.steps == 4


def test_a_failing_step_is_logged_counted_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeTime(rounds=3)
    calls = [0]
    errors: list[Exception] = []

    def step() -> None:
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("boom")

    r = runner_on(fake, step, 1.0, on_error=errors.append)
    with caplog.at_level(logging.ERROR, "flowsched.periodic"):
        r.run()
    assert calls[0] == 3 and r.steps == 3 and r.failures == 1
    assert [str(e) for e in errors] == ["boom"]
    assert "t: round failed" in caplog.text and "RuntimeError: boom" in caplog.text
    assert fake.waits == [1.0, 1.0, 1.0]  # the failed round kept its place in the schedule


def test_stop_during_a_step_ends_the_loop_without_another_wait() -> None:
    fake = FakeTime(rounds=100)

    def step() -> None:
        r.stop()

    r = runner_on(fake, step, 1.0)
    r.run()
    assert r.steps == 1 and fake.waits == []


def test_stop_wakes_the_real_wait_at_once_and_joins() -> None:
    entered = threading.Event()

    def step() -> None:
        entered.set()

    r = PeriodicRunner("t-real", step, 3600.0).start()
    assert entered.wait(5) and r.alive
    r.stop(join_s=5)  # the hour-long wait ends now, not in an hour
    assert not r.alive and r.steps == 1


def test_start_again_after_stop_runs_again() -> None:
    ran = threading.Semaphore(0)
    r = PeriodicRunner("t-restart", ran.release, 3600.0)
    r.start()
    assert ran.acquire(timeout=5)
    r.stop(join_s=5)
    r.start()
    assert ran.acquire(timeout=5)  # a new first step, at once
    r.stop(join_s=5)
    assert r.steps == 2


def test_stop_without_start_is_harmless() -> None:
    r = PeriodicRunner("t-idle", lambda: None, 1.0)
    r.stop(join_s=1)
    assert not r.alive and r.stopping


def test_fixed_delay_ignores_the_step_time() -> None:
    assert fixed_delay(3.0)(10.0) == 3.0 and fixed_rate(3.0)(1.0) == 2.0
