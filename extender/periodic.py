"""PeriodicRunner: the one background loop every periodic job in the service runs on.

A daemon thread calls `step`, waits, and calls it again until stopped:
- the first step runs as soon as the runner starts;
- `delay` says how long to wait after a step: a number of seconds (a fixed pause after each
  step, however long it took), or a callable given the step's duration in seconds that returns
  the wait (`fixed_rate` keeps a period; a caller's own callable gives back-off or jitter);
- a step that raises is logged with its traceback, counted (`failures`, and `on_error` for a
  caller that keeps its own count) and the loop goes on: one bad round never ends a loop;
- `stop()` wakes the wait at once; a step in progress is never interrupted, and
  `stop(join_s=...)` waits up to that long for it to return.

`clock` (to time a step) and `wait` (the pause) can be injected, so a test runs `run()` in its
own thread on fake time instead of sleeping.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("flowsched.periodic")

Delay = Callable[[float], float]  # the step's duration in seconds -> seconds to wait before the next


def fixed_delay(seconds: float) -> Delay:
    """Wait `seconds` after every step, however long the step took."""
    return lambda _took: seconds


def fixed_rate(seconds: float) -> Delay:
    """Start a step every `seconds`: wait what is left of the period (nothing if the step overran it)."""
    return lambda took: seconds - took


def name_os_thread(name: str) -> None:
    """The calling thread's name as the OS shows it (top -H, /proc/PID/task/*/comm; 15 bytes
    at most), so a thread's CPU can be told apart from outside the process. Linux only."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


class PeriodicRunner:
    def __init__(
        self,
        name: str,  # the thread's name, and what the log says failed
        step: Callable[[], object],
        delay: float | Delay,
        *,
        logger: logging.Logger = log,
        on_error: Callable[[Exception], None] | None = None,
        os_thread_name: bool = False,  # also name the OS thread (see name_os_thread)
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[float], object] | None = None,  # default: the stop event's wait
    ) -> None:
        self.name, self.logger, self.on_error = name, logger, on_error
        self._step = step
        self._delay: Delay = delay if callable(delay) else fixed_delay(delay)
        self._os_thread_name = os_thread_name
        self._clock, self._wait = clock, wait
        self.steps = 0  # steps run, failed ones included
        self.failures = 0  # steps that raised
        # A fresh event per start(): a thread that outlived stop()'s join keeps its own (set) event
        # and ends after its step, even if the runner was started again meanwhile.
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def stopping(self) -> bool:
        """True once stop() was called; a long step checks it to return early."""
        return self._stop.is_set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run_step(self) -> bool:
        """One step now, in the calling thread; False when it raised (logged and counted)."""
        self.steps += 1
        try:
            self._step()
        except Exception as e:  # a failed round must not end the loop; the next one retries
            self.failures += 1
            self.logger.exception("%s: round failed", self.name)
            if self.on_error is not None:
                self.on_error(e)
            return False
        return True

    def run(self) -> None:
        """The loop, in the calling thread, until stop() (what start()'s thread runs)."""
        self._loop(self._stop)

    def _loop(self, stop: threading.Event) -> None:
        if self._os_thread_name:
            name_os_thread(self.name)
        wait = self._wait or stop.wait
        while not stop.is_set():
            started = self._clock()
            self.run_step()
            if stop.is_set():
                break
            wait(max(0.0, self._delay(self._clock() - started)))

    def start(self) -> PeriodicRunner:
        """Runs the loop in a daemon thread; after stop() it may be started again."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(self._stop,), name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, join_s: float = 0.0) -> None:
        """Ends the loop: the wait returns at once, a step in progress finishes. With join_s > 0,
        returns once the thread ended or after join_s seconds, whichever is first."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and join_s > 0:
            thread.join(join_s)
