"""The `flowsched` command: serve, demo, simulate."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from extender.settings import SettingsError, build_settings

log = logging.getLogger("flowsched")


def _serve(ns: argparse.Namespace) -> int:
    from extender.http.api_front import FrontConfig
    from extender.http.front_process import ApiFront, FrontPeer, bind_listener, private_socket_path, refusals_counter
    from extender.http.listeners import serve_listeners
    from extender.http.server import server_config
    from extender.http.server_limits import ServerLimits
    from extender.http.webhook import MAX_BODY_BYTES as WEBHOOK_MAX_BODY
    from extender.progress.store import StoreError
    from extender.service import build_service

    try:
        settings = build_settings(
            Path(ns.config) if ns.config else None,
            host=ns.host, port=ns.port, api_port=ns.api_port, kubeconfig=ns.kubeconfig, url_prefix=ns.url_prefix,
            kube=False if ns.no_kube else None,
            debug_telemetry_injection=True if ns.debug_telemetry_injection else None,
            controllers=_controllers(ns), control={"dry_run": False} if ns.act else None,
        )
    except (SettingsError, ValidationError) as e:
        print(f"flowsched: bad settings: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        service = build_service(settings)
    except (FileNotFoundError, StoreError) as e:
        print(f"flowsched: {e}", file=sys.stderr)
        return 2
    loop: Any = "auto"
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:
        pass
    limits = ServerLimits(header_timeout_s=settings.header_timeout_s, body_timeout_s=settings.body_timeout_s,
                          keep_alive_s=settings.keep_alive_s, max_connections=settings.max_connections,
                          graceful_shutdown_s=settings.shutdown_timeout_s, max_url_bytes=settings.max_url_bytes,
                          max_header_count=settings.max_header_count, max_head_bytes=settings.max_head_bytes,
                          write_timeout_s=settings.write_timeout_s)
    tls: dict[str, Any] = {"ssl_certfile": settings.tls_cert_file, "ssl_keyfile": settings.tls_key_file}
    # Two listeners (DESIGN.md §12): kube-scheduler's verbs, and everything tenants call, which a
    # front process of its own takes and forwards here over a private Unix socket.
    verbs = server_config(service.app.listener("verbs"), host=settings.host, port=settings.port,
                          limits=dataclasses.replace(limits, max_connections=settings.verbs_max_connections),
                          log_level=settings.log_level.lower(), loop=loop, **tls)
    try:
        sock = bind_listener(settings.host, settings.api_port)
    except OSError as e:
        print(f"flowsched: cannot listen on {settings.host}:{settings.api_port} (api_port): {e}", file=sys.stderr)
        return 2
    uds = private_socket_path()
    # The front has applied the per-peer budgets; the forwarded requests come from one client.
    forwarded = dataclasses.replace(limits, keep_alive_s=60, max_connections=4 * settings.max_concurrent_requests)
    api = server_config(FrontPeer(service.app.listener("api")), host="", port=0, uds=uds, limits=forwarded,
                        log_level=settings.log_level.lower(), loop=loop, lifespan="off")
    front = ApiFront(FrontConfig(
        uds=uds, limits=limits, max_in_flight=settings.max_concurrent_requests,
        per_client=settings.max_in_flight_per_client, rate_per_client_s=settings.api_rate_per_client_s,
        max_body_bytes=max(settings.progress_max_body_bytes, WEBHOOK_MAX_BODY, settings.verb_max_body_bytes),
        progress_max_body_bytes=settings.progress_max_body_bytes,
        verb_paths=tuple(service.app.verbs), log_level=settings.log_level.lower(), loop=str(loop),
        nice=settings.api_nice, tls_cert_file=settings.tls_cert_file, tls_key_file=settings.tls_key_file), sock,
        refusals=refusals_counter(service.metrics.registry))
    service.app.live_checks["api_front"] = front.alive
    return serve_listeners(verbs, api, settings.gil_switch_interval_s, front)


def _controllers(ns: argparse.Namespace) -> list[str] | None:
    names = [x.strip() for x in (ns.controllers or "").split(",") if x.strip()]
    if ns.with_migrator and "migrator" not in names:
        names.append("migrator")
    return names or None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="flowsched", description="Convergence-aware GPU scheduler extender")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the scheduler extender HTTP service",
                           description="Serve kube-scheduler's extender verbs (filter, prioritize, preempt). "
                                       "Settings come from FLOWSCHED_* variables, --config, then these flags.")
    serve.add_argument("--config", help="YAML or TOML settings file")
    serve.add_argument("--host", help="listen address (default 0.0.0.0)")
    serve.add_argument("--port", type=int, help="the verbs' port, for kube-scheduler alone (default 8888)")
    serve.add_argument("--api-port", type=int,
                       help="the port of the progress API, webhook, /metrics, UI, docs, debug (default 8889)")
    serve.add_argument("--url-prefix", help="path prefix of the verbs, e.g. /scheduler")
    serve.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, $KUBECONFIG, ~/.kube/config)")
    serve.add_argument("--no-kube", action="store_true", help="run without a cluster: every node is unknown")
    serve.add_argument("--debug-telemetry-injection", action="store_true",
                       help="enable POST /debug/telemetry (tests only)")
    serve.add_argument("--controllers", help="control loops to run while this replica holds the Lease, "
                                             "comma-separated: migrator,resizer,elastic,admission,idle")
    serve.add_argument("--act", action="store_true",
                       help="let the control loops act (default: dry run, plans only at /debug/*)")
    serve.add_argument("--with-migrator", action="store_true", help=argparse.SUPPRESS)
    sub.add_parser("migrate", help="serve with the migrator loop on (= serve --controllers migrator)",
                   add_help=False)

    sub.add_parser("demo", help="simulate a generated workload and compare flowsched with the baselines",
                   add_help=False)
    sub.add_parser("simulate", help="simulate a workload file (e.g. the Pollux workloads)", add_help=False)

    if argv and argv[0] in ("demo", "simulate"):
        from benchmarks.sim.entry import demo_main, simulate_main

        return demo_main(argv[1:]) if argv[0] == "demo" else simulate_main(argv[1:])
    if argv and argv[0] == "migrate":
        if "-h" in argv or "--help" in argv:
            print("flowsched migrate [flags]: flowsched serve with the migrator loop on "
                  "(= serve --controllers migrator); the flags are serve's:")
        argv = ["serve", "--with-migrator", *argv[1:]]
    ns = parser.parse_args(argv)
    if ns.command == "serve":
        return _serve(ns)
    parser.error(f"unknown command {ns.command}")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
