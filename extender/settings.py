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
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)  # full-Node mode at 5k nodes is ~30 MB
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
    # Filter-only mode (verb filter-ranked, docs/hot-path.md): nodes scored up to this many points
    # (of 10) below the best node still pass; 0 passes only the best-scored ones.
    rank_margin: int = Field(0, ge=0, le=10)

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
