"""Bounded fuzz suite (issue 18): generated requests against every client-facing endpoint.

In-process: requests go straight into the ASGI app (no sockets), so 5,000+ requests per
endpoint take seconds. Derandomized (the same examples on every run, no flakiness) and
without an example database. Requests are drawn near the real shapes (both verb modes,
preempt in both victim forms, progress reports) with any field replaced by junk: wrong
types, huge or non-finite numbers, lone surrogates, odd casing, broken JSON.

Must hold for every request: the answer is < 500 and no exception escapes; a 200 has the
shape kube-scheduler (or the progress client) expects.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.http.app import build_app
from extender.http.auth import StaticTokenAuthenticator
from extender.http.progress_api import ProgressApiMetrics, ProgressApiSettings, build_progress_router
from extender.metrics import build_metrics
from extender.progress.store import ProgressStore, ProgressStoreSettings
from extender.settings import Settings
from extender.snapshot.objects import parse_node, parse_pod
from extender.snapshot.state import ClusterState
from tests.k8s_factories import node, pod

PER_ENDPOINT = 5_000
BATCH = 5  # requests per hypothesis example: fewer examples, same number of requests
EXAMPLES = PER_ENDPOINT // BATCH + 100  # margin so the count holds
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
NODES = ["n0", "n1", "n2", "n3"]
UIDS = ["uid-default-a", "uid-default-b", "uid-default-c"]
TOKEN = "fuzz-token"


# ---- an in-process ASGI client ----

class Asgi:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.codes: Counter[int] = Counter()

    def call(self, method: str, path: str, body: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None,
             client: tuple[str, int] = ("10.0.0.9", 4000)) -> tuple[int, bytes]:
        status, out = self.loop.run_until_complete(self._call(method, path, body, headers or [], client))
        self.codes[status] += 1
        return status, out

    async def _call(self, method: str, path: str, body: bytes, headers: list[tuple[bytes, bytes]],
                    client: tuple[str, int]) -> tuple[int, bytes]:
        raw_path, _, query = path.partition("?")
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": raw_path, "raw_path": raw_path.encode("utf-8", "surrogatepass"),
                 "query_string": query.encode("utf-8", "surrogatepass"),
                 "root_path": "", "client": client, "server": ("127.0.0.1", 8888),
                 "headers": [(b"content-length", str(len(body)).encode()),
                             (b"content-type", b"application/json"), *headers]}
        delivered = False

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if delivered:
                return {"type": "http.disconnect"}
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        status = 0
        chunks: list[bytes] = []

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, send)  # an exception escaping here fails the test
        return status, b"".join(chunks)

    def close(self) -> None:
        self.loop.close()


# ---- strategies ----

junk = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
surrogates = st.sampled_from(["\udc00", "\ud800", "\udfff", "a\ud83dz"])
text = st.text(max_size=12) | surrogates | st.sampled_from(["", " ", "default", "n0", "x" * 300])


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Usually the plausible value, sometimes junk in its place."""
    return st.one_of(*[strategy] * 12, junk)  # nested fields multiply: keep each one mostly plausible


quantity = st.one_of(
    st.sampled_from(["1", "0", "2", "8", "100m", "2Gi", "1.5", "4", "16Gi"]),
    st.sampled_from(["-1", "1e308", "1e309", "NaN", "inf", "-inf", "1E3", "", "abc", "1Qi", "0.0001m", "9" * 400]),
    st.integers(min_value=-10, max_value=10**20), st.floats(allow_nan=True), junk,
)
resources = st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]) | st.text(max_size=6),
                            quantity, max_size=3)
container = st.fixed_dictionaries({}, optional={
    "name": maybe(text),
    "resources": maybe(st.fixed_dictionaries({}, optional={"requests": maybe(resources),
                                                            "limits": maybe(resources)})),
})
annotations = st.dictionaries(
    st.sampled_from(["flowsched.io/migrated-from", "flowsched.io/checkpointable", "flowsched.io/migration",
                     "flowsched.io/elastic"]) | text, maybe(text), max_size=3)
pod_name = st.sampled_from(["p", "q", "trainer-0"]) | text
metadata = st.fixed_dictionaries({"name": maybe(pod_name)}, optional={
    "namespace": maybe(text), "uid": maybe(st.sampled_from(UIDS) | text),
    "resourceVersion": maybe(st.sampled_from(["1", "2"]) | text),
    "annotations": maybe(annotations), "labels": maybe(st.dictionaries(text, text, max_size=3)),
    "ownerReferences": maybe(st.lists(st.dictionaries(st.sampled_from(["kind", "name", "controller"]), junk),
                                      max_size=2)),
    "deletionTimestamp": maybe(text), "creationTimestamp": maybe(text),
})
spec = st.fixed_dictionaries({}, optional={
    "containers": maybe(st.lists(maybe(container), max_size=3)),
    "initContainers": maybe(st.lists(maybe(container), max_size=2)),
    "overhead": maybe(resources), "priority": maybe(st.integers(min_value=-(2**40), max_value=2**40)),
    "nodeName": maybe(text),
})
a_pod = maybe(st.fixed_dictionaries({"metadata": maybe(metadata)}, optional={"spec": maybe(spec),
                                                                             "status": junk}))
node_name = st.one_of(*[st.sampled_from(NODES)] * 4, text)


def casing(key: str) -> st.SearchStrategy[str]:
    return st.sampled_from([key, key.lower(), key.upper()])


@st.composite
def extender_args(draw: st.DrawFn) -> Any:
    body: dict[str, Any] = {draw(casing("Pod")): draw(a_pod)}
    if draw(st.booleans()):  # names mode (nodeCacheCapable)
        body[draw(casing("NodeNames"))] = draw(maybe(st.lists(maybe(node_name), max_size=6)))
    else:  # full-Node mode
        items = st.lists(maybe(st.fixed_dictionaries({"metadata": maybe(st.fixed_dictionaries(
            {"name": maybe(node_name)}))})), max_size=5)
        body[draw(casing("Nodes"))] = draw(maybe(st.fixed_dictionaries({}, optional={"items": maybe(items)})))
    return body


@st.composite
def preemption_args(draw: st.DrawFn) -> Any:
    body: dict[str, Any] = {draw(casing("Pod")): draw(a_pod)}
    full = draw(st.booleans())
    uid = maybe(st.sampled_from(UIDS) | text)
    victim = (maybe(st.fixed_dictionaries({"metadata": maybe(st.fixed_dictionaries({}, optional={"uid": uid}))}))
              if full else maybe(st.fixed_dictionaries({draw(casing("UID")): uid})))
    victims = maybe(st.fixed_dictionaries({}, optional={
        "Pods": maybe(st.lists(victim, max_size=4)),
        "NumPDBViolations": maybe(st.integers(min_value=-(2**70), max_value=2**70)),
    }))
    key = "NodeNameToVictims" if full else "NodeNameToMetaVictims"
    body[draw(casing(key))] = draw(maybe(st.dictionaries(node_name, victims, max_size=4)))
    return body


point = st.fixed_dictionaries({"step": maybe(st.integers(min_value=-5, max_value=2**70)),
                               "loss": maybe(st.floats(allow_nan=True) | st.none())},
                              optional={"timestamp": maybe(st.floats(allow_nan=True)),
                                        "metrics": maybe(st.dictionaries(text, maybe(st.floats(allow_nan=True)),
                                                                         max_size=3))})
report = maybe(st.fixed_dictionaries(
    {"namespace": maybe(st.one_of(*[st.just("team-a")] * 6, st.just("x"), text)),
     "job": maybe(st.one_of(*[st.sampled_from(["j1", "j2"])] * 6, text)),
     "points": maybe(st.lists(maybe(point), max_size=4))},
    optional={"pod": maybe(text), "higher_is_better": maybe(st.booleans()),
              "training": maybe(st.fixed_dictionaries({}, optional={
                  k: maybe(st.integers(min_value=-5, max_value=2**65) | st.floats(allow_nan=True))
                  for k in ("batch_size", "batch_min", "batch_max", "grad_sqr", "grad_var", "max_steps",
                            "target_metric")}))}))


plausible_report = st.fixed_dictionaries(  # well-formed, values still drawn: most of these are 200s
    {"namespace": st.just("team-a"), "job": st.sampled_from(["j1", "j2"]),
     "points": st.lists(st.fixed_dictionaries(
         {"step": st.integers(min_value=0, max_value=10**9), "loss": st.floats(allow_nan=True) | st.none()},
         optional={"timestamp": st.floats(allow_nan=True),
                   "metrics": st.dictionaries(text, st.floats(allow_nan=True), max_size=3)}), min_size=1, max_size=4)},
    optional={"pod": text, "higher_is_better": st.booleans()})


def encode(obj: Any, garble: int) -> bytes:
    """JSON as Python writes it (NaN literals, \\u escapes for surrogates); sometimes broken."""
    raw = json.dumps(obj, allow_nan=True).encode()
    if garble == 1:
        return raw[: len(raw) // 2]
    if garble == 2:
        return b"\xff" + raw
    return raw


garbles = st.sampled_from([0] * 18 + [1, 2])


# ---- fixtures ----

def cluster() -> ClusterState:
    s = ClusterState()
    for i, name in enumerate(NODES):
        s.upsert_node(parse_node(node(name, gpus=4 * (i + 1))))
    s.upsert_pod(parse_pod(pod("a", gpus=2, node_name="n1", phase="Running", uid=UIDS[0])))
    s.upsert_pod(parse_pod(pod("b", gpus=1, node_name="n2", phase="Running", uid=UIDS[1],
                               annotations={"flowsched.io/checkpointable": "true"})))
    s.mark_synced()
    return s


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    store = ProgressStore(ProgressStoreSettings(path=str(tmp_path_factory.mktemp("fuzz") / "p.sqlite")))
    progress = build_progress_router(store, StaticTokenAuthenticator({TOKEN: frozenset({"team-a"})}),
                                     ProgressApiSettings(), ProgressApiMetrics.build(build_metrics().registry))
    app = build_app(Settings(kube=False), cluster(), build_metrics(), routers=[progress])
    c = Asgi(app)
    yield c
    c.close()
    store.close()


FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


def check_verb(client: Asgi, verb: str, bodies: list[tuple[Any, int]], counter: Counter[str]) -> None:
    for obj, garble in bodies:
        status, out = client.call("POST", f"/{verb}", encode(obj, garble))
        counter[verb] += 1
        assert status < 500, (verb, obj, out[:300])
        if status != 200:
            continue
        reply = json.loads(out)
        if verb == "filter":
            assert set(reply) == FILTER_KEYS
        elif verb == "prioritize":
            assert isinstance(reply, list) and all(0 <= h["Score"] <= 10 for h in reply)
        else:
            assert set(reply) == {"NodeNameToMetaVictims"}


def run_counted(test: Any, counter: Counter[str], key: str, client: Asgi) -> None:
    before = client.codes.copy()
    test()
    assert counter[key] >= PER_ENDPOINT, f"only {counter[key]} {key} requests were generated"
    codes = client.codes - before
    print(f"{key}: {counter[key]} requests, answers {dict(sorted(codes.items()))}")
    # Worth its time only if a fair share got past parsing, and junk was refused.
    assert codes[200] > 0.02 * counter[key] and codes[400] > 0.02 * counter[key], codes


@pytest.mark.timeout(600)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_fuzz_filter_and_prioritize_both_modes(client: Asgi, verb: str) -> None:
    counter: Counter[str] = Counter()

    @FUZZ
    @given(st.lists(st.tuples(extender_args(), garbles), min_size=BATCH, max_size=BATCH))
    def fuzz(bodies: list[tuple[Any, int]]) -> None:
        check_verb(client, verb, bodies, counter)

    run_counted(fuzz, counter, verb, client)


@pytest.mark.timeout(600)
def test_fuzz_preempt_both_victim_forms(client: Asgi) -> None:
    counter: Counter[str] = Counter()

    @FUZZ
    @given(st.lists(st.tuples(preemption_args(), garbles), min_size=BATCH, max_size=BATCH))
    def fuzz(bodies: list[tuple[Any, int]]) -> None:
        check_verb(client, "preempt", bodies, counter)

    run_counted(fuzz, counter, "preempt", client)


@pytest.mark.timeout(600)
def test_fuzz_progress_api(client: Asgi) -> None:
    counter: Counter[str] = Counter()
    auth = [(b"authorization", f"Bearer {TOKEN}".encode())]

    @FUZZ
    @given(st.tuples(plausible_report, st.just(0), st.just(True)),
           st.lists(st.tuples(report, garbles, st.booleans()), min_size=BATCH - 1, max_size=BATCH - 1))
    def fuzz(first: tuple[Any, int, bool], rest: list[tuple[Any, int, bool]]) -> None:
        for obj, garble, authed in [first, *rest]:
            status, out = client.call("POST", "/v1/progress", encode(obj, garble), auth if authed else None)
            counter["progress"] += 1
            assert status < 500, (obj, out[:300])
            if status == 200:
                assert {"accepted", "rejected", "reasons"} <= set(json.loads(out))
            ns = obj.get("namespace") if isinstance(obj, dict) else None
            job = obj.get("job") if isinstance(obj, dict) else None
            if isinstance(ns, str) and isinstance(job, str):
                path = f"/v1/jobs/{ns}/{job}"
                status, out = client.call("GET", path, b"", auth)
                counter["jobs"] += 1
                assert status < 500, (path, out[:300])

    run_counted(fuzz, counter, "progress", client)
