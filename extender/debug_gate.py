"""The one gate in front of everything that shows the cluster's insides: the /debug/* routes,
the API documentation (/docs, /openapi.json) and the status page (/ui).

Today the debug routes are open (they are served on the same listener as the verbs, with no
credentials; issue 18 changes that), so the gate admits everyone. Whatever check the debug
routes get, give it here as FastAPI dependencies and /docs and /ui follow.
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
