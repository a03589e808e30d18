"""Service settings: environment (FLOWSCHED_*), an optional YAML/TOML file, then CLI flags.

One Settings object is built at start-up and passed to whatever needs it; nothing reads
the environment later.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from extender.telemetry.config import TelemetryConfig
from scoring.convergence import ConvergenceSettings
from scoring.placement import PlacementSettings


class PlacementConfig(BaseModel):
    saturation_util_pct: float = Field(90.0, ge=0, le=100)
    min_fb_free_mib: float = Field(0.0, ge=0)
    weight_headroom: float = Field(1.0, ge=0)
    weight_utilisation: float = Field(1.0, ge=0)
    weight_convergence: float = Field(0.5, ge=0)
    pack_gpus: bool = True
    origin_penalty: float = Field(3.0, ge=0)

    def to_policy(self) -> PlacementSettings:
        return PlacementSettings(**self.model_dump())


class ConvergenceConfig(BaseModel):
    window_s: float = Field(30.0, ge=0)  # FlowCon's Δ
    alpha: float = Field(0.15, gt=0)  # relative pace (growth) below this is slow growth
    plateau_rel_tol: float = Field(0.05, gt=0, lt=1)
    interval_s: float = Field(10.0, gt=0)  # how often phases are re-estimated
    active_within_s: float = Field(3600.0, gt=0)  # jobs silent for longer are not re-estimated

    def to_policy(self) -> ConvergenceSettings:
        return ConvergenceSettings(window_s=self.window_s, alpha=self.alpha, plateau_rel_tol=self.plateau_rel_tol)


class ControlConfig(BaseModel):
    """Shared by every control loop (migrator, resizer, elastic). See docs/control-loops.md."""

    # Safety first: loops plan, log and show their plans at /debug/* but change nothing until an
    # operator sets dry_run=false (flag --act).
    dry_run: bool = True
    lease_namespace: str = "flowsched"
    lease_name: str = "flowsched-controllers"
    identity: str | None = None  # default: $POD_NAME, else hostname-pid
    lease_duration_s: float = Field(15.0, gt=0)
    renew_deadline_s: float = Field(10.0, gt=0)
    retry_period_s: float = Field(2.0, gt=0)
    permanent_backoff_s: float = Field(3600.0, ge=0)  # a key whose action failed for good is left alone
    retry_after_s: float = Field(30.0, ge=0)  # least wait after a refusal (429 from a PDB, 5xx)
    # Namespaces no loop ever touches; a namespace labelled opt_out_label="false" is skipped too.
    excluded_namespaces: list[str] = ["kube-system"]
    opt_out_label: str = "flowsched.io/migrate"

    @model_validator(mode="after")
    def _ordered(self) -> ControlConfig:
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("control: need retry_period_s < renew_deadline_s < lease_duration_s")
        return self


class LoopConfig(BaseModel):
    interval_s: float = Field(60.0, gt=0)
    max_per_interval: int = Field(1, ge=0)
    max_per_hour: int = Field(6, ge=0)


class MigratorConfig(LoopConfig):
    min_runtime_s: float = Field(600.0, ge=0)  # a job younger than this is never moved
    max_migrations: int = Field(2, ge=0)  # per job
    cooldown_s: float = Field(1800.0, ge=0)  # hysteresis: not moved again within this
    min_remaining_s: float = Field(300.0, ge=0)  # a job predicted to end sooner frees its GPUs itself
    restart_cost_s: float = Field(120.0, ge=0)  # estimated checkpoint + restart, reported with the plan
    require_room_elsewhere: bool = True  # move only if the job itself fits on another node afterwards
    origin_ttl_s: float = Field(3600.0, gt=0)  # how long the extender scores the origin node down
    # "benefit": SpeCon, the move that serves most waiting GPUs. "attained": least attained service
    # through eviction: only pods waiting >= wait_threshold_s call for a move, and the slow job with
    # the most GPU-seconds since its pods started (>= min_attained_gpu_s) yields (docs/control-loops.md).
    order: Literal["benefit", "attained"] = "benefit"
    wait_threshold_s: float = Field(600.0, ge=0)
    min_attained_gpu_s: float = Field(4 * 3600.0, ge=0)
    slow_phases: list[Literal["watching", "completing"]] = ["completing"]


class ResizerConfig(LoopConfig):
    """In-place CPU resize of pods annotated flowsched.io/resizable: "true" (docs/resizer.md)."""

    interval_s: float = Field(30.0, gt=0)  # FlowCon's window
    max_per_interval: int = Field(4, ge=0)
    max_per_hour: int = Field(60, ge=0)
    beta: float = Field(2.0, gt=0)  # completing pods keep at least 1/(beta N) of the node's pool
    min_step_m: float = Field(100.0, ge=0)  # smallest change made, millicores
    hysteresis: float = Field(0.10, ge=0)  # ...and at least this fraction of the current request
    cooldown_s: float = Field(120.0, ge=0)  # a pod is not resized again within this
    min_cpu_m: float = Field(100.0, ge=0)  # absolute floor of any resized request
    headroom_m: float = Field(0.0, ge=0)  # per node, kept out of the pool the resized pods share


class ElasticConfig(LoopConfig):
    """GPU counts (and batch sizes) for jobs annotated flowsched.io/elastic: "min-max" (docs/elastic.md)."""

    interval_s: float = Field(30.0, gt=0)
    max_per_interval: int = Field(4, ge=0)
    max_per_hour: int = Field(30, ge=0)
    restart_s: float = Field(120.0, ge=0)  # progress a job loses to a rescale (checkpoint + restart)
    horizon_s: float = Field(1800.0, gt=0)  # how long a plan is expected to hold
    min_gain: float = Field(0.10, ge=0)  # keep the current size unless a change gains more than this
    cooldown_s: float = Field(300.0, ge=0)  # a job is not rescaled again within this
    sync_fraction: float = Field(0.1, ge=0)  # prior: share of a 1-GPU step spent syncing (multi-GPU)
    reserve_pending: bool = True  # GPUs asked for by waiting non-elastic pods are kept out of the plan
    patch_pytorchjobs: bool = True  # patch Kubeflow PyTorchJob Worker replicas (with an elasticPolicy)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLOWSCHED_", env_nested_delimiter="__", extra="forbid")

    host: str = "0.0.0.0"
    port: int = Field(8888, ge=0, le=65535)
    url_prefix: str = ""  # e.g. "/scheduler": the verbs are then /scheduler/filter, ...
    # The verbs' body limit in names mode (nodeCacheCapable: true): 10,000 nodes of 253-character
    # names plus a large pod is under 3 MiB. Full-Node mode sends whole Node objects (~30 MB at
    # 5,000 nodes): set full_node_mode and its own limit, full_node_max_body_bytes.
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    kubeconfig: str | None = None  # None: in-cluster, then $KUBECONFIG, then ~/.kube/config
    kube: bool = True  # False runs without a cluster (nodes unknown, neutral answers)
    gpu_resource: str = "nvidia.com/gpu"
    resync_s: float = Field(600.0, gt=0)  # full relist period, a safety net under the watches
    watch_timeout_s: int = Field(300, gt=0)
    backoff_max_s: float = Field(30.0, gt=0)
    telemetry_stale_s: float = Field(60.0, gt=0)
    completing_horizon_s: float = Field(600.0, ge=0)
    debug_telemetry_injection: bool = False  # POST /debug/telemetry, for tests only
    log_level: str = "info"
    progress_db: str = "flowsched-progress.sqlite"  # SQLite file of training progress
    progress_max_body_bytes: int = Field(1 << 20, ge=1024)
    # tokenreview: the pod's service-account token, checked by the apiserver (default);
    # static: tokens from static_tokens_file ("<token> <ns>[,<ns>...]" or "*" per line).
    progress_auth: Literal["tokenreview", "static"] = "tokenreview"
    static_tokens_file: str | None = None
    convergence: ConvergenceConfig = ConvergenceConfig()
    placement: PlacementConfig = PlacementConfig()
    # Control loops run in this process, each only while it holds the Lease (see ControlConfig).
    controllers: list[Literal["migrator", "resizer", "elastic"]] = []
    control: ControlConfig = ControlConfig()
    migrator: MigratorConfig = MigratorConfig()
    resizer: ResizerConfig = ResizerConfig()
    elastic: ElasticConfig = ElasticConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    # ---- limits against slow, idle or hostile clients (docs/hardening.md) ----
    full_node_mode: bool = False  # kube-scheduler sends full Node objects (nodeCacheCapable: false)
    full_node_max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)  # the verbs' limit in that mode
    max_concurrent_requests: int = Field(64, ge=1)  # in flight at once; more get 503 (probes exempt)
    max_connections: int = Field(1024, ge=16)  # lowered to fit RLIMIT_NOFILE; longest-idle closed at the cap
    header_timeout_s: float = Field(10.0, gt=0)  # request line + headers must arrive within this
    body_timeout_s: float = Field(30.0, gt=0)  # the body must arrive within this of the headers
    keep_alive_s: int = Field(5, ge=1)  # an idle kept-alive connection is closed after this
    shutdown_timeout_s: int = Field(10, ge=1)  # open requests get this long after SIGTERM
    # /debug/*: "loopback" answers only connections from 127.0.0.1/::1 (kubectl port-forward);
    # "open" answers anyone who can reach the port (trusted networks only).
    debug_access: Literal["loopback", "open"] = "loopback"
    debug_page_limit: int = Field(500, ge=1, le=5000)  # most entries per kind in one /debug/snapshot page
    tls_cert_file: str | None = None  # serve HTTPS with this certificate chain (PEM) ...
    tls_key_file: str | None = None  # ... and key; kube-scheduler: enableHTTPS + tlsConfig.caFile
    token_review_timeout_s: float = Field(5.0, gt=0)
    token_review_threads: int = Field(4, ge=1)  # its own pool: a slow apiserver never holds SQLite's
    token_review_negative_ttl_s: float = Field(10.0, ge=0)  # a rejected token is not re-reviewed within this
    token_review_rate_per_s: float = Field(20.0, gt=0)  # new TokenReviews per second (burst 2x); more get 503

    @property
    def verb_max_body_bytes(self) -> int:
        return self.full_node_max_body_bytes if self.full_node_mode else self.max_body_bytes

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file go together")
        return self

    @property
    def prefix(self) -> str:
        p = self.url_prefix.strip().rstrip("/")
        return "" if not p else (p if p.startswith("/") else "/" + p)


class SettingsError(ValueError):
    pass


def load_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as e:
        raise SettingsError(f"cannot read config file {path}: {e.strerror}") from e
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as e:
        raise SettingsError(f"config file {path} is not valid {path.suffix or 'YAML'}: {e}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path} must hold a mapping at the top level")
    return data


def build_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """File values override the environment; explicit overrides (CLI flags) override both."""
    data: dict[str, Any] = load_file(config_file) if config_file else {}
    env = Settings()  # reads FLOWSCHED_*
    merged = env.model_dump()
    for k, v in data.items():
        if isinstance(v, dict) and isinstance(merged.get(k), dict):
            merged[k] = {**merged[k], **v}
        else:
            merged[k] = v
    for k, v in overrides.items():
        if v is None:
            continue
        # A nested override (e.g. control={"dry_run": False}) changes only the keys it names.
        merged[k] = {**merged[k], **v} if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
    return Settings.model_validate(merged)


def load_static_tokens(path: str) -> dict[str, frozenset[str]]:
    """'<token> <namespace>[,<namespace>...]' per line ('*' = every namespace); # comments."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise SettingsError(f"cannot read static tokens file {path}: {e.strerror}") from e
    tokens: dict[str, frozenset[str]] = {}
    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise SettingsError(f"{path}:{n}: expected '<token> <namespace>[,<namespace>...]'")
        tokens[parts[0]] = frozenset(x for x in parts[1].split(",") if x)
    return tokens
