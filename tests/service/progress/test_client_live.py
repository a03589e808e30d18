"""flowsched_client against a real `flowsched serve --no-kube`, and with the server away."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.local_serve import Served, free_port, local_flowsched
from flowsched_client import Reporter, ReporterConfig, hf_rule, keras_rule, lightning_max_steps, lightning_rule
from tests.cluster import tools

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with local_flowsched() as s:
        yield s


def _config(s: Served, job: str, **kw: object) -> ReporterConfig:
    base: dict[str, object] = {"url": s.api_url, "job": job, "namespace": s.namespace, "token": s.token,
                               "flush_every": 50, "flush_s": 1e9, "max_points_per_s": 0.0}
    base.update(kw)
    return ReporterConfig(**base)  # type: ignore[arg-type]


def _stored_steps(s: Served, job: str) -> list[int]:
    with sqlite3.connect(f"file:{s.db}?mode=ro", uri=True) as db:
        return [int(r[0]) for r in db.execute("SELECT step FROM points WHERE job=? ORDER BY id", (job,))]


def _get_job(s: Served, job: str) -> dict[str, object]:
    req = urllib.request.Request(f"{s.api_url}/v1/jobs/{s.namespace}/{job}",
                                 headers={"Authorization": f"Bearer {s.token}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        out: dict[str, object] = json.loads(resp.read())
        return out


def test_points_arrive_in_order_and_close_flushes(served: Served) -> None:
    r = Reporter(_config(served, "ordered", flush_every=7))
    for step in range(1, 501):
        r.report(step, 2.0 / step)
    r.close()  # the last 500 % 7 points go with close()
    assert _stored_steps(served, "ordered") == list(range(1, 501))
    assert r.dropped == 0 and r.sent == 500


def test_close_alone_sends_what_never_reached_a_flush(served: Served) -> None:
    r = Reporter(_config(served, "closing", flush_every=10**6))
    r.training(max_steps=1000, early_stopping={"patience": 5, "min_delta": 0.0, "metric": None})
    for step in range(1, 31):
        r.report(step, 1.0 + 1.0 / step)
    time.sleep(0.2)
    assert _stored_steps(served, "closing") == []  # not due yet: nothing sent
    r.close()
    assert _stored_steps(served, "closing") == list(range(1, 31))
    job = _get_job(served, "closing")
    training = job["training"]
    assert isinstance(training, dict) and training["max_steps"] == 1000 and training["early_stopping"]["patience"] == 5
    remaining = job["remaining_steps"]
    assert job["end_reason"] in ("planned_end", "early_stopping")
    assert isinstance(remaining, float) and 0.0 <= remaining <= 970.0  # never past the planned end


def test_the_training_thread_never_waits_for_a_server_that_is_away() -> None:
    # one port nothing listens on (refused at once), one that accepts and never answers (times out)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1000)
    try:
        for url in (f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{silent.getsockname()[1]}"):
            r = Reporter(ReporterConfig(url=url, job="j", namespace="ns", token="t", flush_every=10,
                                        max_buffer=1000, timeout_s=2.0))
            worst, total = 0.0, 0.0
            for step in range(20_000):
                t0 = time.perf_counter()
                r.report(step, 1.0)
                dt = time.perf_counter() - t0
                worst, total = max(worst, dt), total + dt
            mean_us = total / 20_000 * 1e6
            assert mean_us < 50.0, (url, mean_us)  # a deque append, not an HTTP round trip
            assert worst < 0.5, (url, worst)  # never one send's timeout (2 s); a loaded machine may pause a thread
            # bounded: the oldest went; at most max_buffer queued plus the batch being tried
            assert 20_000 - 2 * 1000 <= r.dropped <= 20_000 - 1000
            t0 = time.perf_counter()
            r.close(timeout_s=3.0)
            assert time.perf_counter() - t0 < 12.0
    finally:
        silent.close()


def test_the_client_installs_and_runs_on_the_standard_library_alone() -> None:
    # -S: no site-packages at all; -c with only the checkout's root on the path
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "import flowsched_client\n"
        "r = flowsched_client.Reporter(flowsched_client.ReporterConfig(url='http://127.0.0.1:9', job='j', "
        "namespace='n', token='t', flush_every=1, timeout_s=0.2))\n"
        "r.report(1, 0.5); r.flush(); r.close(timeout_s=1)\n"
        "bad = sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] not in sys.stdlib_module_names "
        "and m.split('.')[0] not in ('flowsched_client', '__main__'))\n"
        "print(','.join(sorted(set(bad))))\n")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_rules_are_read_from_the_frameworks_objects() -> None:
    EarlyStopping = type("EarlyStopping", (), {})
    es = EarlyStopping()
    es.monitor, es.patience, es.min_delta, es.mode = "val_loss", 8, -0.001, "min"  # Lightning keeps it signed
    assert lightning_rule([object(), es]) == {"patience": 8, "min_delta": 0.001, "metric": "val_loss",
                                              "higher_is_better": False}
    assert lightning_rule([object()]) is None
    assert lightning_max_steps(SimpleNamespace(max_steps=5000)) == 5000
    assert lightning_max_steps(SimpleNamespace(max_steps=-1, estimated_stepping_batches=1200)) == 1200
    assert lightning_max_steps(SimpleNamespace(max_steps=-1, estimated_stepping_batches=float("inf"))) is None
    HfEs = type("EarlyStoppingCallback", (), {})
    hf = HfEs()
    hf.early_stopping_patience, hf.early_stopping_threshold = 3, 0.01
    args = SimpleNamespace(metric_for_best_model="accuracy", greater_is_better=True)
    assert hf_rule([hf], args) == {"patience": 3, "min_delta": 0.01, "metric": "eval_accuracy",
                                   "higher_is_better": True}
    keras_es = SimpleNamespace(monitor="val_accuracy", patience=4, min_delta=0.0, mode="auto")
    assert keras_rule(keras_es) == {"patience": 4, "min_delta": 0.0, "metric": "val_accuracy",
                                    "higher_is_better": True}
    assert keras_rule(SimpleNamespace(monitor="val_loss", patience=0, min_delta=0.0)) is None


@pytest.mark.torch
def test_torch_losses_are_converted_in_one_stack_per_flush_never_one_by_one() -> None:
    torch_python = tools.torch_python()  # torch is not a project dependency: a cached environment
    code = f"""
import sys; sys.path.insert(0, {str(ROOT)!r})
import torch
from flowsched_client import Reporter, ReporterConfig
calls = {{"stack": 0, "item": 0, "float": 0}}
stack, item, to_float = torch.stack, torch.Tensor.item, torch.Tensor.__float__
def counting(name, f):
    def g(*a, **k):
        calls[name] += 1
        return f(*a, **k)
    return g
torch.stack = counting("stack", stack)
torch.Tensor.item = counting("item", item)
torch.Tensor.__float__ = counting("float", to_float)
bodies = []
r = Reporter(ReporterConfig(url="http://x", job="j", namespace="n", token="t", flush_every=10**6,
                            max_points_per_s=0.0), send=lambda u, b, h, t: bodies.append(b) or 200)
m = torch.nn.Linear(4, 1)
losses = []
for step in range(100):
    loss = m(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    losses.append(loss.detach().clone())
    r.report(step, loss)
assert calls == {{"stack": 0, "item": 0, "float": 0}}, calls  # report() converted nothing
assert r.flush()
assert calls == {{"stack": 1, "item": 0, "float": 0}}, calls  # one stack for the flush
import json
sent = [p["loss"] for p in json.loads(bodies[0])["points"]]
assert sent == [l.tolist() for l in losses], (sent[:3], losses[:3])
print("ok")
"""
    out = subprocess.run([torch_python, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"
