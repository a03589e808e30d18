"""KubeActions bounds every control write by write_timeout_s, which the service sets to
lease_duration_s - renew_deadline_s: a write started just before a replica stops leading lands
before another replica may take the Lease over."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extender.control.kube_actions import EVICTED, KubeActions
from extender.control.runtime import build_controllers
from extender.kube.errors import TemporaryError
from extender.settings import Settings


class Response:
    def __init__(self, status: int = 200, body: bytes = b"{}") -> None:
        self.status, self.body = status, body

    def read(self) -> bytes:
        return self.body

    def getheaders(self) -> dict[str, str]:
        return {}


class RecordingClient:
    """The two ApiClient methods kube.client.send uses; records each call's timeout."""

    def __init__(self, response: Response | None = None, error: Exception | None = None) -> None:
        self.timeouts: list[tuple[str, str, float]] = []
        self.response, self.error = response or Response(), error

    def param_serialize(self, method: str, resource_path: str, **_: Any) -> tuple[str, str, dict[str, str], Any, None]:
        return method, resource_path, {}, None, None

    def call_api(self, method: str, url: str, *, _request_timeout: float, **_: Any) -> Response:
        self.timeouts.append((method, url, _request_timeout))
        if self.error is not None:
            raise self.error
        return self.response


def test_every_write_carries_the_write_timeout() -> None:
    api = RecordingClient()
    actions = KubeActions(api, write_timeout_s=4.0)
    assert actions.evict("t", "p", "uid") == EVICTED
    assert actions.check_evictable("t", "p", "uid") == EVICTED
    assert actions.annotate_pod("t", "p", {"a": "b"})
    assert actions.set_scheduling_gates("t", "p", [])
    assert [t for *_, t in api.timeouts] == [4.0, 4.0, 4.0, 4.0]


def test_a_timed_out_write_is_temporary() -> None:
    actions = KubeActions(RecordingClient(error=TimeoutError("read timed out")), write_timeout_s=4.0)
    with pytest.raises(TemporaryError):
        actions.evict("t", "p", "uid")


def test_the_service_sets_it_to_the_lease_margin() -> None:
    s = Settings.model_validate({"kube": False, "controllers": ["migrator"],
                                 "control": {"lease_duration_s": 20, "renew_deadline_s": 12}})
    from extender.snapshot.state import ClusterState

    ctl = build_controllers(s, state=ClusterState(), tracker=None,  # type: ignore[arg-type]
                            api_client=RecordingClient(), registry=CollectorRegistry())
    assert ctl is not None
    actions = ctl.controllers["migrator"].ctx.actions  # type: ignore[attr-defined]
    assert actions.write_timeout_s == 8.0
    ctl.stop()


def test_the_elastic_and_resizer_shells_send_through_the_actions_and_keep_its_retry() -> None:
    """A refused resize, resize-list or PyTorchJob read waits control.retry_after_s (the actions'
    retry_s) like every other control write; these shells once sent on their own with 30 s."""
    from extender.control.elastic import Elastic
    from extender.control.events import LogRecorder
    from extender.control.resizer import Resizer
    from extender.snapshot.state import ClusterState
    from tests.control_fakes import FakeTracker, make_context

    busy = RecordingClient(Response(429, b'{"kind":"Status","code":429}'))
    actions = KubeActions(busy, retry_s=77.0, write_timeout_s=4.0)
    ctx = make_context(ClusterState(), FakeTracker({}), actions, LogRecorder())
    resizer = Resizer(ctx)
    for call in (lambda: resizer._patch_resize("t", "p", "main", {"requests": {"cpu": "2"}}),
                 lambda: resizer._list_pods("n1")):
        with pytest.raises(TemporaryError) as refused:
            call()
        assert refused.value.delay_s == 77.0
    elastic = Elastic(ctx, ctx.core.elastic)
    with pytest.raises(TemporaryError) as refused:
        elastic._scale_pytorchjob("t", "job", 4, 1, "{}", None, lambda _what: None)  # type: ignore[arg-type]
    assert refused.value.delay_s == 77.0
    assert [t for *_, t in busy.timeouts] == [4.0, 10.0, 10.0]
