"""Service settings: environment (FLOWSCHED_*), an optional YAML/TOML file, then CLI flags.

One Settings object is built at start-up and passed to whatever needs it; nothing reads
the environment later.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_settings import BaseSettings, SettingsConfigDict

from extender.telemetry.config import TelemetryConfig
from scoring.placement import PlacementSettings
from scoring.settings import (
    AdmissionLoopSettings,
    CoreSettings,
    ElasticLoopSettings,
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
else:
    ConvergenceConfig = _parsed(TrackerSettings)
    PlacementConfig = _parsed(PlacementSettings)
    MigratorConfig = _parsed(MigratorLoopSettings)
    ElasticConfig = _parsed(ElasticLoopSettings)
    ResizerConfig = _parsed(ResizerLoopSettings)
    AdmissionConfig = _parsed(AdmissionLoopSettings)


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
    completing_horizon_s: float = Field(_CORE.completing_horizon_s, ge=0)
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
    controllers: list[Literal["migrator", "resizer", "elastic", "admission"]] = []
    control: ControlConfig = ControlConfig()
    migrator: MigratorConfig = MigratorConfig()
    resizer: ResizerConfig = ResizerConfig()
    elastic: ElasticConfig = ElasticConfig()
    admission: AdmissionConfig = AdmissionConfig()
    telemetry: TelemetryConfig = TelemetryConfig()

    def core(self) -> CoreSettings:
        """The control core's settings tree, as parsed (the same objects, typed as scoring's)."""
        return CoreSettings(convergence=self.convergence, placement=self.placement, safety=self.control.safety(),
                            migrator=self.migrator, elastic=self.elastic, resizer=self.resizer,
                            admission=self.admission,
                            completing_horizon_s=self.completing_horizon_s)

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
