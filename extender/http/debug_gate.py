"""The one gate in front of everything that shows the cluster's insides: the /debug/* routes,
the API documentation (/docs, /openapi.json) and the status page (/ui).

The gate itself is extender.http.extender_app.ExtenderApp, in front of FastAPI: every path that
`is_debug_path` names answers only loopback peers unless debug_access is "open" (issue 18;
docs/hardening.md). A further check (a credential, say) can be given here as FastAPI
dependencies: routers from debug_router() run them after the peer check.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter


def debug_dependencies() -> Sequence[Any]:
    """FastAPI dependencies (fastapi.Depends(...)) every debug-class route runs first."""
    return []


def debug_router() -> APIRouter:
    """A router whose routes sit behind the debug gate."""
    return APIRouter(dependencies=list(debug_dependencies()))


DEBUG_PATHS = frozenset({"/ui", "/docs", "/openapi.json"})


def is_debug_path(path: str) -> bool:
    """Whether a request path is one of the debug class (see the module's docstring)."""
    return path.startswith("/debug/") or path in DEBUG_PATHS or path.startswith("/docs/")
