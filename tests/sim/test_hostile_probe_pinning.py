"""The hostile probe's core pinning (issue 33, finding 7 separated): every thread of the server
and of its child lands where it is told, the main thread (the verbs' loop) apart."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.hostile_probe import parse_cpus, pin_tree

# A parent with a second thread and a child process, like `flowsched serve` and its front.
SERVER = """
import subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("ready", flush=True)
time.sleep(60)
"""


def test_parse_cpus() -> None:
    assert parse_cpus("0,1") == {0, 1}
    assert parse_cpus("") is None


def test_pin_tree_puts_the_loop_the_threads_and_the_child_where_asked() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    loop, rest = {cpus[0]}, {cpus[-1]}  # the same on a one-CPU machine: then only the pinning is seen
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        pinned = pin_tree(server.pid, rest, None, loop)
        tids = [int(t.name) for t in Path(f"/proc/{server.pid}/task").iterdir()]
        child = int(Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()[0])
        assert pinned == len(tids) + len(list(Path(f"/proc/{child}/task").iterdir()))
        assert os.sched_getaffinity(server.pid) == loop
        assert all(os.sched_getaffinity(t) == rest for t in tids if t != server.pid)
        assert os.sched_getaffinity(child) == rest
    finally:
        server.kill()
        server.wait()
