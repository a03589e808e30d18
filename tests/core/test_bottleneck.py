"""The bottleneck classifier (scoring.bottleneck), from arrays."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from scoring.bottleneck import (
    PS,
    WORKER,
    Bottleneck,
    BottleneckSettings,
    JobSignals,
    diagnose,
    diagnose_all,
    scaling_from_samples,
    step_rate_and_trend,
)

S = BottleneckSettings()
NAN = math.nan
LINK = S.link_bytes_s


def sig(n: int = 2, *, roles: tuple[str, ...] | None = None, nodes: tuple[str, ...] | None = None,
        util: Any = 0.9, cpu: Any = 1.0, limit: Any = 4.0, net: Any = 0.05 * LINK, pod_rate: Any = NAN,
        step_rate: float = 2.0, trend: float = 0.0, scaling: float = NAN,
        ps_range: tuple[int, int] | None = None) -> JobSignals:
    """n pods; scalars broadcast to every pod (PS pods get no GPU utilisation)."""
    roles = roles or (WORKER,) * n
    n = len(roles)

    def arr(x: Any) -> np.ndarray:
        return np.broadcast_to(np.asarray(x, dtype=np.float64), (n,)).copy()

    gpu = arr(util)
    gpu[np.array(roles) == PS] = NAN
    return JobSignals(job="ns/j", pods=tuple(f"p{k}" for k in range(n)), roles=roles,
                      nodes=nodes or tuple(f"n{k}" for k in range(n)), gpu_util=gpu, cpu_used=arr(cpu),
                      cpu_limit=arr(limit), net_bytes_s=arr(net), pod_step_rate=arr(pod_rate),
                      step_rate=step_rate, step_trend=trend, scaling=scaling, ps_range=ps_range)


def test_busy_gpus_are_compute_bound_with_evidence() -> None:
    d = diagnose(sig(util=0.95), S)
    assert d.kind == Bottleneck.COMPUTE
    assert 0.8 < d.confidence <= 1.0
    assert any("GPU utilisation 95%" in e for e in d.evidence)
    assert d.confident(S)


def test_confidence_grows_with_the_evidence() -> None:
    low = diagnose(sig(util=0.81), S).confidence
    high = diagnose(sig(util=0.99), S).confidence
    assert low < high


def test_starved_gpus_with_saturated_cpu_are_input_bound() -> None:
    d = diagnose(sig(util=0.3, cpu=3.9, limit=4.0), S)
    assert d.kind == Bottleneck.INPUT
    assert d.where == "workers"
    assert d.confidence >= S.act_confidence
    assert any("CPU at 98%" in e for e in d.evidence)


def test_starved_gpus_with_saturated_network_are_communication_bound() -> None:
    d = diagnose(sig(util=0.35, cpu=1.0, net=0.95 * LINK), S)
    assert d.kind == Bottleneck.COMMUNICATION
    assert d.where == "network"


def test_a_saturated_parameter_server_is_communication_bound_at_the_ps() -> None:
    s = sig(roles=(WORKER, WORKER, WORKER, PS), util=0.3, cpu=np.array([1, 1, 1, 3.9]),
            net=np.array([0.1, 0.1, 0.1, 0.5]) * LINK, ps_range=(1, 3))
    d = diagnose(s, S)
    assert d.kind == Bottleneck.COMMUNICATION
    assert d.where == PS
    assert d.shape.ps == 1 and d.shape.workers == 3 and d.shape.ps_range == (1, 3)


def test_no_steps_and_idle_gpus_are_idle() -> None:
    d = diagnose(sig(util=0.0, step_rate=0.0), S)
    assert d.kind == Bottleneck.IDLE and d.confidence == 1.0


def test_a_slow_replica_is_a_straggler_and_named() -> None:
    d = diagnose(sig(4, util=0.9, pod_rate=np.array([2.0, 2.0, 0.8, 2.1])), S)
    assert d.kind == Bottleneck.STRAGGLER
    assert d.slow_pods == ("p2",) and d.where == "n2"


def test_a_replica_whose_gpu_idles_while_the_others_wait_for_it_is_a_straggler() -> None:
    d = diagnose(sig(4, util=np.array([0.95, 0.2, 0.9, 0.92]), cpu=np.array([1, 3.95, 1, 1])), S)
    assert d.kind == Bottleneck.STRAGGLER and d.slow_pods == ("p1",)
    assert any("p1 CPU at 99%" in e for e in d.evidence)


def test_a_slow_majority_is_the_jobs_pace_not_a_straggler() -> None:
    d = diagnose(sig(4, util=0.9, pod_rate=np.array([2.0, 0.5, 0.5, 0.5])), S)
    assert d.kind != Bottleneck.STRAGGLER


# -- missing metrics: unknown stays unknown ------------------------------------------------------------
def test_nothing_measured_is_unknown() -> None:
    d = diagnose(sig(util=NAN, cpu=NAN, limit=NAN, net=NAN, step_rate=NAN), S)
    assert d.kind == Bottleneck.UNKNOWN and d.confidence == 0.0
    assert not d.confident(S)


def test_starved_gpus_with_cpu_and_network_unknown_is_unknown_not_a_guess() -> None:
    d = diagnose(sig(util=0.2, cpu=NAN, net=NAN), S)
    assert d.kind == Bottleneck.UNKNOWN
    assert "unknown" in d.evidence[0]


def test_saturated_cpu_without_gpu_utilisation_is_unknown() -> None:
    d = diagnose(sig(util=NAN, cpu=4.0, limit=4.0), S)
    assert d.kind == Bottleneck.UNKNOWN
    assert "GPU utilisation" in d.evidence[0]


def test_a_missing_rival_lowers_confidence_but_keeps_the_measured_diagnosis() -> None:
    both = diagnose(sig(util=0.3, cpu=3.9), S)
    no_net = diagnose(sig(util=0.3, cpu=3.9, net=NAN), S)
    assert no_net.kind == both.kind == Bottleneck.INPUT
    assert no_net.confidence == pytest.approx(both.confidence * S.missing_rival)


def test_no_cpu_limit_cannot_be_cpu_saturated() -> None:
    d = diagnose(sig(util=0.3, cpu=7.0, limit=math.inf), S)
    assert d.kind == Bottleneck.UNKNOWN
    assert "neither CPU nor network saturated" in d.evidence[0]


def test_waiting_gpus_with_nothing_saturated_is_unknown() -> None:
    d = diagnose(sig(util=0.3, cpu=1.0, net=0.1 * LINK), S)
    assert d.kind == Bottleneck.UNKNOWN


def test_an_unstable_step_rate_is_not_diagnosed_yet() -> None:
    d = diagnose(sig(util=0.3, cpu=3.9, trend=-0.5), S)
    assert d.kind == Bottleneck.UNKNOWN and "not yet stable" in d.evidence[0]


def test_idle_gpus_without_a_step_rate_need_cpu_and_network_to_be_idle() -> None:
    assert diagnose(sig(util=0.0, cpu=0.0, net=0.0, step_rate=NAN), S).kind == Bottleneck.IDLE
    assert diagnose(sig(util=0.0, cpu=NAN, net=0.0, step_rate=NAN), S).kind == Bottleneck.UNKNOWN


# -- conflicting evidence ------------------------------------------------------------------------------
def test_no_steps_but_busy_gpus_is_conflicting_and_unknown() -> None:
    d = diagnose(sig(util=0.9, step_rate=0.0), S)
    assert d.kind == Bottleneck.UNKNOWN and "conflicting" in d.evidence[0]


def test_cpu_and_network_equally_saturated_is_unknown() -> None:
    d = diagnose(sig(util=0.3, cpu=0.95 * 4, net=0.95 * S.net_saturated / S.cpu_saturated * LINK), S)
    assert d.kind == Bottleneck.UNKNOWN and "conflicting" in d.evidence[0]


def test_the_clearly_stronger_saturation_wins_with_less_confidence() -> None:
    alone = diagnose(sig(util=0.3, cpu=4.0), S)
    d = diagnose(sig(util=0.3, cpu=4.0, net=0.70 * LINK), S)  # 1.11 vs 1.00 of their thresholds
    assert d.kind == Bottleneck.INPUT
    assert d.confidence < alone.confidence


def test_busy_gpus_saturated_network_and_poor_scaling_is_communication() -> None:
    # Collective kernels keep GPUs "busy" while they wait: the scaling decides.
    d = diagnose(sig(util=0.9, net=0.9 * LINK, scaling=0.4), S)
    assert d.kind == Bottleneck.COMMUNICATION
    good = diagnose(sig(util=0.9, net=0.9 * LINK, scaling=0.95), S)
    assert good.kind == Bottleneck.COMPUTE
    unmeasured = diagnose(sig(util=0.9, net=0.9 * LINK), S)
    assert unmeasured.kind == Bottleneck.COMPUTE
    assert unmeasured.confidence < good.confidence


# -- shapes and settings -------------------------------------------------------------------------------
def test_arrays_must_match_the_pods() -> None:
    s = sig()
    with pytest.raises(ValueError, match="one entry per pod"):
        replace(s, gpu_util=np.array([0.5]))
    with pytest.raises(ValueError, match="unknown role"):
        replace(s, roles=("worker", "chief"))


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        BottleneckSettings(busy_util=0.3, starved_util=0.5)
    with pytest.raises(ValueError):
        BottleneckSettings(cpu_saturated=1.5)


def test_a_job_of_only_parameter_servers_is_unknown() -> None:
    assert diagnose(sig(roles=(PS, PS)), S).kind == Bottleneck.UNKNOWN


def test_diagnose_all_keys_by_job_and_as_dict_is_plain() -> None:
    out = diagnose_all([sig(util=0.95)], S)
    body = out["ns/j"].as_dict()
    assert body["bottleneck"] == "compute-bound"
    assert body["shape"] == {"workers": 2, "ps": 0, "nodes": 2}


def test_step_rate_and_trend_over_windows() -> None:
    ts = np.arange(0.0, 121.0, 10.0)  # a point every 10 s for 2 minutes
    steps = np.concatenate([np.arange(0, 7) * 20, 120 + np.arange(1, 7) * 10]).astype(np.int64)  # 2/s then 1/s
    rate, trend = step_rate_and_trend(steps, ts, now=120.0, window_s=60.0)
    assert rate == pytest.approx(1.0) and trend == pytest.approx(-0.5)


def test_step_rate_is_unknown_without_two_points_and_survives_a_restart() -> None:
    assert math.isnan(step_rate_and_trend(np.array([5]), np.array([1.0]), 10.0, 60.0)[0])
    ts = np.array([0.0, 10.0, 20.0, 30.0, 40.0])
    steps = np.array([100, 110, 50, 60, 70], dtype=np.int64)  # restarted from a checkpoint at t=20
    rate, _ = step_rate_and_trend(steps, ts, now=40.0, window_s=60.0)
    assert rate == pytest.approx(1.0)
    stalled = step_rate_and_trend(np.array([7, 7, 7], dtype=np.int64), np.array([0.0, 30.0, 60.0]), 60.0, 60.0)
    assert stalled[0] == 0.0


def test_scaling_from_measured_step_times() -> None:
    assert scaling_from_samples({1: 1.0, 4: 0.25}, 4) == pytest.approx(1.0)  # linear
    assert scaling_from_samples({2: 1.0, 8: 0.5}, 8) == pytest.approx(0.5)
    assert math.isnan(scaling_from_samples({4: 0.25}, 4))  # one size: unknown
    assert math.isnan(scaling_from_samples({1: 1.0}, 4))  # not measured at its size
