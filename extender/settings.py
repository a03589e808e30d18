"""Service settings: environment (FLOWSCHED_*), an optional YAML/TOML file, then CLI flags.

One Settings object is built at start-up and passed to whatever needs it; nothing reads
the environment later.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_settings import BaseSettings, SettingsConfigDict

from extender.prometheus.config import DiagnosisConfig, TelemetryConfig
from scoring.bottleneck import BottleneckSettings
from scoring.gpu_types import GpuTypeSettings
from scoring.placement import PlacementSettings
from scoring.settings import (
    AdmissionLoopSettings,
    CoreSettings,
    ElasticLoopSettings,
    IdleLoopSettings,
    MigratorLoopSettings,
    ResizerLoopSettings,
    SafetySettings,
    TrackerSettings,
)

_SAFETY = SafetySettings()
_CORE = CoreSettings()


def _parsed(cls: type[Any]) -> Any:
    """A scoring/ settings dataclass as pydantic parses it: same fields, same defaults, same
    checks (its __post_init__), unknown keys refused. The result is a subclass of `cls`."""
    return pydantic_dataclass(cls, config=ConfigDict(extra="forbid"), frozen=True)


# Every default of the control core lives in scoring/settings.py (and scoring.placement /
# scoring.convergence); these are the same classes, made parseable.
if TYPE_CHECKING:  # to the type checker they are scoring's classes, which they subclass
    ConvergenceConfig = TrackerSettings
    PlacementConfig = PlacementSettings
    MigratorConfig = MigratorLoopSettings
    ElasticConfig = ElasticLoopSettings
    ResizerConfig = ResizerLoopSettings
    AdmissionConfig = AdmissionLoopSettings
    IdleConfig = IdleLoopSettings
    BottleneckConfig = BottleneckSettings
    GpuTypesConfig = GpuTypeSettings
else:
    ConvergenceConfig = _parsed(TrackerSettings)
    PlacementConfig = _parsed(PlacementSettings)
    MigratorConfig = _parsed(MigratorLoopSettings)
    ElasticConfig = _parsed(ElasticLoopSettings)
    ResizerConfig = _parsed(ResizerLoopSettings)
    AdmissionConfig = _parsed(AdmissionLoopSettings)
    IdleConfig = _parsed(IdleLoopSettings)
    BottleneckConfig = _parsed(BottleneckSettings)
    GpuTypesConfig = _parsed(GpuTypeSettings)


class ControlConfig(BaseModel):
    """Shared by every control loop: the lease here, the safety rules in scoring.settings.SafetySettings
    (flattened into this section for compatibility). See docs/control-loops.md."""

    model_config = ConfigDict(extra="forbid")

    # Safety first: loops plan, log and show their plans at /debug/* but change nothing until an
    # operator sets dry_run=false (flag --act).
    dry_run: bool = _SAFETY.dry_run
    lease_namespace: str = "flowsched"
    lease_name: str = "flowsched-controllers"
    identity: str | None = None  # default: $POD_NAME, else hostname-pid
    lease_duration_s: float = Field(15.0, gt=0)
    renew_deadline_s: float = Field(10.0, gt=0)
    retry_period_s: float = Field(2.0, gt=0)
    permanent_backoff_s: float = Field(3600.0, ge=0)  # a key whose action failed for good is left alone
    retry_after_s: float = Field(30.0, ge=0)  # least wait after a refusal (429 from a PDB, 5xx)
    # Namespaces no loop ever touches; a namespace labelled opt_out_label="false" is skipped too.
    excluded_namespaces: list[str] = list(_SAFETY.excluded_namespaces)
    opt_out_label: str = _SAFETY.opt_out_label
    hold_s: float = Field(_SAFETY.hold_s, ge=0)  # composition: a job one loop changed is left to settle

    @model_validator(mode="after")
    def _ordered(self) -> ControlConfig:
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("control: need retry_period_s < renew_deadline_s < lease_duration_s")
        return self

    def safety(self) -> SafetySettings:
        return SafetySettings(dry_run=self.dry_run, excluded_namespaces=tuple(self.excluded_namespaces),
                              opt_out_label=self.opt_out_label, hold_s=self.hold_s)


class ProgressSourcesConfig(BaseModel):
    """Progress without SDK posts (docs/progress-sources.md): container logs and Prometheus gauges,
    for pods annotated flowsched.io/progress=logs|prometheus. Both run on the Lease holder only
    when control loops are configured (else in the one replica)."""

    model_config = ConfigDict(extra="forbid")

    logs: bool = True  # follow the logs of pods annotated flowsched.io/progress=logs
    log_max_streams: int = Field(100, ge=1)  # open pods/log streams at most
    log_connects_per_s: float = Field(5.0, gt=0)  # new streams per second at most (token bucket)
    log_min_point_interval_s: float = Field(1.0, ge=0)  # per stream, the newest point per window is kept
    log_flush_s: float = Field(2.0, gt=0)  # points go to the store in batches this often
    log_read_timeout_s: float = Field(60.0, gt=0)  # an idle stream is reopened after this
    log_reconnect_max_s: float = Field(60.0, gt=0)  # back-off cap after a failed stream
    reconcile_s: float = Field(5.0, gt=0)  # how often the wanted streams / queries are recomputed
    prometheus: bool = True  # read flowsched.io/loss-metric gauges (needs prometheus_url)
    prometheus_url: str = ""  # "" uses telemetry.prometheus_url
    prometheus_interval_s: float = Field(15.0, gt=0)  # one query per job per interval
    prometheus_lookback_s: float = Field(600.0, gt=0)  # first read of a job: this much history
    prometheus_max_jobs: int = Field(1000, ge=1)  # jobs queried per round at most
    # HA (docs/progress-sources.md): with a URL here, every progress point is remote-written to this
    # Prometheus before it is acknowledged, and every replica reads job progress from it (the
    # SQLite file is then a per-replica copy nobody reads). Needs --web.enable-remote-write-receiver.
    shared_prometheus_url: str = ""
    shared_remote_write_url: str = ""  # "" = <shared_prometheus_url>/api/v1/write
    shared_history_window_s: float = Field(7 * 86400.0, gt=0)
    shared_write_timeout_s: float = Field(5.0, gt=0)


class ProgressQuotaConfig(BaseModel):
    """Per-namespace quotas of the progress store (docs/hardening.md): past one, POST /v1/progress
    answers 429 with Retry-After (issue 33, finding 7: one team's token filled 1,075 MiB in 30 s)."""

    model_config = ConfigDict(extra="forbid")
    max_jobs_per_namespace: int = Field(1000, ge=1)
    max_points_per_namespace: int = Field(1_000_000, ge=1)
    max_bytes_per_namespace: int = Field(256 * 1024 * 1024, ge=1024)  # the points' payload, not the file
    max_metric_names_per_namespace: int = Field(64, ge=0)  # distinct side-metric names since start


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLOWSCHED_", env_nested_delimiter="__", extra="forbid")

    host: str = "0.0.0.0"
    port: int = Field(8888, ge=0, le=65535)  # the verbs, for kube-scheduler alone (DESIGN.md §12)
    # The progress API, job status, webhook, /metrics, UI, docs and debug: every training pod's
    # listener, on a loop and limits of its own so nothing a tenant does reaches the verbs.
    api_port: int = Field(8889, ge=0, le=65535)
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
    completing_horizon_s: float = Field(_CORE.completing_horizon_s, ge=0)
    debug_telemetry_injection: bool = False  # POST /debug/telemetry, for tests only
    # Both logging's and uvicorn's level names; any case ("INFO") is accepted.
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    progress_db: str = "flowsched-progress.sqlite"  # SQLite file of training progress
    progress_max_body_bytes: int = Field(1 << 20, ge=1024)
    progress_quota: ProgressQuotaConfig = ProgressQuotaConfig()
    # tokenreview: the pod's service-account token, checked by the apiserver (default);
    # static: tokens from static_tokens_file ("<token> <ns>[,<ns>...]" or "*" per line).
    progress_auth: Literal["tokenreview", "static"] = "tokenreview"
    static_tokens_file: str | None = None
    convergence: ConvergenceConfig = ConvergenceConfig()
    placement: PlacementConfig = PlacementConfig()
    # Control loops run in this process, each only while it holds the Lease (see ControlConfig).
    controllers: list[Literal["migrator", "resizer", "elastic", "admission", "idle", "remedies"]] = []
    control: ControlConfig = ControlConfig()
    migrator: MigratorConfig = MigratorConfig()
    resizer: ResizerConfig = ResizerConfig()
    elastic: ElasticConfig = ElasticConfig()
    admission: AdmissionConfig = AdmissionConfig()
    idle: IdleConfig = IdleConfig()  # idle GPUs: Events, metric, opt-in reclamation (docs/sharing.md)
    # The diagnosis' thresholds (docs/bottlenecks.md); `diagnosis` turns it on and sets its window.
    bottleneck: BottleneckConfig = BottleneckConfig()
    gpu_types: GpuTypesConfig = GpuTypesConfig()  # mixed GPU generations (docs/gpu-types.md)
    # POST /webhook/gate (docs/admission.md, "Opting in") gates new pods whose schedulerName is one of these.
    webhook_schedulers: list[str] = ["flowsched"]
    telemetry: TelemetryConfig = TelemetryConfig()
    progress_sources: ProgressSourcesConfig = ProgressSourcesConfig()
    diagnosis: DiagnosisConfig = DiagnosisConfig()  # per-job bottleneck diagnosis (docs/bottlenecks.md)
    # Filter-only mode (verb filter-ranked, docs/hot-path.md): nodes scored up to this many points
    # (of 10) below the best node still pass; 0 passes only the best-scored ones.
    rank_margin: int = Field(0, ge=0, le=10)
    # ... and of those, at most this many pass, the best first and ties in kube-scheduler's own
    # order; 0 = all of them. One node left means kube-scheduler runs none of its score plugins,
    # which raised its throughput with flowsched (docs/hot-path.md), but its own scores (soft
    # affinities, spreading) no longer break ties.
    rank_keep: int = Field(1, ge=0)
    # ---- limits against slow, idle or hostile clients (docs/hardening.md) ----
    full_node_mode: bool = False  # kube-scheduler sends full Node objects (nodeCacheCapable: false)
    full_node_max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)  # the verbs' limit in that mode
    max_concurrent_requests: int = Field(64, ge=1)  # in flight at once per port; more get 503 (probes exempt)
    # The API port's open connections: lowered to fit RLIMIT_NOFILE less the verbs' own cap;
    # the longest idle is closed at the cap.
    max_connections: int = Field(1024, ge=16)
    # The verbs port's: kube-scheduler keeps a few per replica (one per parallel call at most,
    # `parallelism` 16); its files are set aside first, so no tenant connection can take them.
    verbs_max_connections: int = Field(128, ge=16)
    # Of the API port's slots, one peer address may hold at most this many (kube-scheduler's port
    # has no such cap: it has one client). Above it: 503 + Retry-After.
    max_in_flight_per_client: int = Field(16, ge=1)
    # ... and send at most this many requests a second (bursts of 2x; probes and /webhook/gate,
    # whose caller is the apiserver, exempt); more get 429 + Retry-After: 1.
    api_rate_per_client_s: float = Field(50.0, gt=0)
    max_url_bytes: int = Field(8 * 1024, ge=256)  # longer request targets get 414 and a close
    max_header_count: int = Field(100, ge=8)  # more header lines get 431 and a close
    max_head_bytes: int = Field(64 * 1024, ge=1024)  # request line + headers; more get 431 and a close
    write_timeout_s: float = Field(30.0, gt=0)  # replies left unread this long: connection closed
    # The GIL switch interval under `serve` (Python's default is 5 ms): the API's thread, busy with a
    # tenant's flood, hands the GIL to the verbs' loop within this (docs/hardening.md, figures).
    gil_switch_interval_s: float = Field(0.0005, gt=0, le=0.1)
    # The API port's front process (every tenant connection) runs at this much lower CPU priority
    # than the verbs' process, so that on a busy node kube-scheduler's calls win the CPU.
    api_nice: int = Field(10, ge=0, le=19)
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
    # ... of which one peer address may start this many (burst 2x): one client's random tokens
    # cannot use up the budget new pods' first reports need.
    token_review_rate_per_client_s: float = Field(2.0, gt=0)

    @property
    def verb_max_body_bytes(self) -> int:
        return self.full_node_max_body_bytes if self.full_node_mode else self.max_body_bytes

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_case_level(cls, v: Any) -> Any:
        return v.lower() if isinstance(v, str) else v

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file go together")
        return self

    @model_validator(mode="after")
    def _two_ports(self) -> Settings:
        if self.api_port == self.port and self.port != 0:
            raise ValueError(f"api_port must differ from port ({self.port}): the verbs get a listener of their own")
        return self

    def core(self) -> CoreSettings:
        """The control core's settings tree, as parsed (the same objects, typed as scoring's)."""
        return CoreSettings(convergence=self.convergence, placement=self.placement, safety=self.control.safety(),
                            migrator=self.migrator, elastic=self.elastic, resizer=self.resizer,
                            admission=self.admission, idle=self.idle, bottleneck=self.bottleneck,
                            completing_horizon_s=self.completing_horizon_s, gpu_types=self.gpu_types)

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
