"""The one module that touches the `kubernetes` package (an import-linter contract keeps it so):
its config loading (in-cluster or a kubeconfig) and its ApiClient's auth, TLS and connection
pool, through which a Request (extender.kube.requests) is sent. No generated API classes or
models: bodies go out as the API documents them and come back as bytes for responses.py.

    api_client = load_api_client(None)                 # in a pod: the service account
    resp = send(api_client, requests.list_namespaces(), timeout_s=10)
    stream = open_stream(api_client, requests.watch_objects("pods", rv, 300), connect_timeout_s=10,
                         read_timeout_s=330)           # a urllib3 response, read as it arrives
"""

from __future__ import annotations

import os
from typing import Any

from extender.kube.requests import Request
from extender.kube.responses import Response, api_error


def load_api_client(kubeconfig: str | None) -> Any:
    """In-cluster config when running in a pod, else the given file, $KUBECONFIG, ~/.kube/config.
    Raises the client's ConfigException or OSError when there is none."""
    from kubernetes import client, config  # imported on use: a run without a cluster never loads it

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        return client.ApiClient()
    return config.new_client_from_config()  # type: ignore[no-untyped-call]


def _call(api_client: Any, request: Request, timeout: float | tuple[float, float]) -> Any:
    headers = {"Accept": request.accept}
    if request.body is not None:
        headers["Content-Type"] = request.content_type
    method, url, hdrs, body, _ = api_client.param_serialize(
        method=request.method, resource_path=request.path, query_params=list(request.query) or None,
        header_params=headers, body=request.body, auth_settings=["BearerToken"])
    # call_api never raises for a status (only for transport failures): the caller reads it.
    return api_client.call_api(method, url, header_params=hdrs, body=body, _request_timeout=timeout)


def _headers(resp: Any) -> dict[str, str]:
    raw = resp.getheaders() if hasattr(resp, "getheaders") else {}
    return {str(k): str(v) for k, v in dict(raw).items()}


def send(api_client: Any, request: Request, *, timeout_s: float = 30.0) -> Response:
    """One call, its body read whole. Any status comes back as a Response; a transport failure
    (refused, timed out) raises what urllib3 raised."""
    resp = _call(api_client, request, timeout_s)
    data = resp.read()
    body = data if isinstance(data, bytes) else str(data or "").encode()
    return Response(int(resp.status), body, _headers(resp))


def open_stream(api_client: Any, request: Request, *, connect_timeout_s: float, read_timeout_s: float) -> Any:
    """A streaming call (a watch, a followed log): the urllib3 response, not preloaded, for the
    caller to read as it arrives and then release_conn() (or shutdown() from another thread to
    end a read). A status >= 300 is read (its first 2 KiB) and raised as its ApiError."""
    resp = _call(api_client, request, (connect_timeout_s, read_timeout_s)).response
    if resp.status >= 300:
        try:
            text = resp.read(2048)
        finally:
            resp.release_conn()
        raise api_error(request, Response(int(resp.status), bytes(text), _headers(resp)))
    return resp
