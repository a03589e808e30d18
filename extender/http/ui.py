"""GET /ui: the read-only status page (nodes and their GPUs, jobs and their loss curves, the
queue, recent control-loop actions), behind the debug gate like /debug/*.

The data is gathered in a worker thread (StateView.describe and SQLite reads), so a page
view does not hold up the verbs on the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from extender.http.debug_gate import debug_router
from extender.http.status_view import gather_status
from extender.http.ui_render import render_status_page
from extender.progress.store import ProgressStore
from extender.snapshot.state import ClusterState
from scoring.settings import TrackerSettings


def build_ui_router(state: ClusterState, store: ProgressStore, convergence: TrackerSettings,
                    controllers: Callable[[], Any], stale_s: float,
                    clock: Callable[[], float] = time.time) -> APIRouter:
    """`controllers` returns the service's Controllers (or None) when called: they exist only
    once the service is built."""
    router = debug_router()

    def page() -> str:
        return render_status_page(gather_status(state, store, convergence, controllers(), clock(), stale_s))

    @router.get("/ui", response_class=HTMLResponse, tags=["debug"])
    async def status_page() -> HTMLResponse:
        """The status page: self-contained HTML (inline CSS and SVG, no script), refreshing itself."""
        return HTMLResponse(await asyncio.to_thread(page))

    return router
