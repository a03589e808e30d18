"""The API front's own answers (429, 503, 404) show in the verbs' process's /metrics: a platform
engineer sees rejected tenant calls that never reached that process (extender.http.front_counts)."""

from __future__ import annotations

import contextlib
import os
import time

import httpx
from prometheus_client import generate_latest

from extender.http.app import build_app
from extender.http.front_counts import RefusalReader, RefusalTally
from extender.http.front_process import refusals_counter
from extender.metrics import build_metrics
from extender.settings import Settings
from tests.service.http.test_api_front import PRIORITIZE, served
from tests.service.http.test_slow_clients import small_cluster


def test_the_fronts_refusals_are_counted_in_the_verbs_process_metrics() -> None:
    metrics = build_metrics()
    app = build_app(Settings(kube=False), small_cluster(), metrics)
    counter = refusals_counter(metrics.registry)
    with served(app, rate_per_client_s=0.5, refusals=counter) as (_port, api_port, _server):  # bursts of 1
        api = httpx.Client(base_url=f"http://127.0.0.1:{api_port}", timeout=10)
        codes = [api.get("/v1/jobs/a/b").status_code for _ in range(4)]
        assert api.post("/prioritize", content=PRIORITIZE).status_code == 404
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the front writes its counts about once a second
            seen = generate_latest(metrics.registry)
            if b'reason="verb_path"' in seen and b'reason="client_rate"' in seen:
                break
            time.sleep(0.2)
        # /metrics as a Prometheus scrape gets it, through the front (another address: its own budget).
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=10) as other:
            scrape = other.get(f"http://127.0.0.1:{api_port}/metrics")
        assert scrape.status_code == 200
        text = scrape.text
    refused = codes.count(429)
    assert refused >= 2, codes
    assert f'flowsched_api_front_refusals_total{{code="429",reason="client_rate"}} {refused}.0' in text, text
    assert 'flowsched_api_front_refusals_total{code="404",reason="verb_path"} 1.0' in text


def test_counts_are_kept_while_the_pipe_is_full_and_add_up() -> None:
    r, w = os.pipe()
    tally, reader = RefusalTally(w), RefusalReader(r)  # both ends non-blocking
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(w, b"x" * 4096)
    tally.note(429, "client_rate")
    tally.flush()
    assert tally.pending, "a full pipe lost the counts"
    with contextlib.suppress(BlockingIOError):
        while True:
            os.read(r, 1 << 16)  # the filler goes
    tally.note(429, "client_rate")
    tally.note(503, "busy")
    tally.flush()
    assert not tally.pending
    assert reader.drain() == {("429", "client_rate"): 2, ("503", "busy"): 1}
    tally.close()
    assert reader.drain() == {} and reader.fd is None  # the front's end closed: so is the reader
