"""The pure parts of telemetry: exposition text and Prometheus answers into per-GPU arrays."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from extender.prometheus.client import TelemetryError
from extender.prometheus.config import TelemetryConfig
from extender.telemetry.dcgm_emulator import DcgmExporterEmulator
from extender.telemetry.pod_usage import parse_vector
from extender.telemetry.prometheus_source import build_query, parse_query_response, query_request
from extender.telemetry.scrape_source import parse_exposition, targets_from_pod_list
from extender.telemetry.source import FB_FREE, FB_USED, GPU_UTIL, assemble
from tests.telemetry_fixtures import DATADOG_A10G_POD_LINE, DATADOG_T4, NVIDIA_README_K8S

CFG = TelemetryConfig()


def nan_eq(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return len(a) == len(b) and all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b, strict=True))


# ---- exposition text (scrape source) ----

def test_real_t4_page_gives_its_numbers() -> None:
    bad: Counter[str] = Counter()
    rows = parse_exposition(DATADOG_T4, 1000.0, "", "Hostname", bad)
    assert {r.metric for r in rows} == {GPU_UTIL, FB_FREE, FB_USED}  # MEM_COPY_UTIL ignored
    r = assemble(rows)
    t = r.nodes["424773df46e0"]
    assert t.util_pct == (0.0,) and t.fb_free_mib == (15109.0,) and t.fb_used_mib == (0.0,)
    assert t.sampled_at == 1000.0 and not bad


def test_real_pod_mapped_line_attributes_the_pod() -> None:
    # Same labels as the real A10G line, on the utilisation metric.
    line = DATADOG_A10G_POD_LINE.replace("DCGM_FI_PROF_DRAM_ACTIVE", GPU_UTIL).replace("0.000003", "87")
    rows = parse_exposition(line + "\n", 5.0, "", "Hostname", Counter())
    r = assemble(rows)
    assert r.nodes["ip-11111"].util_pct == (87.0,)
    assert r.pods == {"ray-llm/ray-1111111": (("ip-11111", 0),)} and r.pod_util["ray-llm/ray-1111111"] == 87.0


def test_readme_blank_sentinel_and_empty_pod_labels() -> None:
    page = NVIDIA_README_K8S.replace("DCGM_FI_DEV_MEMORY_TEMP", GPU_UTIL)
    bad: Counter[str] = Counter()
    # No Hostname label on these lines: with the node known from discovery they still count.
    rows = parse_exposition(page, 1.0, "node-a", "Hostname", bad)
    assert rows == []  # 9223372036854775794 is DCGM's "blank", not 100 % or more
    assert bad == {"out_of_range": 1}
    assert parse_exposition(page, 1.0, "", "Hostname", Counter()) == []  # and no node label: dropped


def test_emulator_page_round_trips_in_gpu_order() -> None:
    em = DcgmExporterEmulator("gpu-node-1", gpus=4, fb_total_mib=81920)
    em.run_pod("ml", "train-0", gpus=2, util_pct=91, fb_used_mib=30000)
    em.set_gpu(3, 40, 1000)
    page = em.render()
    # The GPU lines of each family reversed: order comes from the gpu label, not line order.
    lines = page.splitlines()
    shuffled = "\n".join(lines[:2] + lines[2:6][::-1] + lines[6:]) + "\n"
    r = assemble(parse_exposition(shuffled, 7.0, "", "Hostname", Counter()))
    t = r.nodes["gpu-node-1"]
    assert t.util_pct == (91.0, 91.0, 0.0, 40.0)
    assert t.fb_free_mib == (51920.0, 51920.0, 81920.0, 80920.0)
    assert r.pods == {"ml/train-0": (("gpu-node-1", 0), ("gpu-node-1", 1))}
    # exact dcgm-exporter shape: HELP/TYPE per family and the label set in exporter order
    assert "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" in page
    assert ('DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-' in page and
            'device="nvidia2",modelName="NVIDIA A100-SXM4-80GB",Hostname="gpu-node-1",'
            'DCGM_FI_DRIVER_VERSION="535.104.05"} 0\n' in page)
    assert 'container="main",namespace="ml",pod="train-0"} 91\n' in page


@pytest.mark.parametrize("page", [
    'DCGM_FI_DEV_GPU_UTIL{gpu="0" 95\n',  # unterminated labels
    "<html><body>502 Bad Gateway</body></html>\n",
    'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="a"} ninety\n',
])
def test_malformed_page_is_an_error_not_a_zero(page: str) -> None:
    with pytest.raises(TelemetryError) as e:
        parse_exposition(page, 1.0, "", "Hostname", Counter())
    assert e.value.reason == "parse"


def test_bad_values_and_labels_are_dropped_and_counted() -> None:
    page = (
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="a"} NaN\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",Hostname="a"} -3\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="x",Hostname="a"} 50\n'
        'DCGM_FI_DEV_GPU_UTIL{Hostname="a"} 50\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="2"} 50\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="3",Hostname="a"} +Inf\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="4",Hostname="a"} 60\n'
    )
    bad: Counter[str] = Counter()
    r = assemble(parse_exposition(page, 1.0, "", "Hostname", bad))
    assert bad == {"not_finite": 2, "out_of_range": 1, "bad_gpu_label": 2, "no_node_label": 1}
    assert nan_eq(r.nodes["a"].util_pct, (math.nan, math.nan, math.nan, math.nan, 60.0))


def test_mig_instances_sum_memory_and_take_the_busiest() -> None:
    labels = 'gpu="1",UUID="GPU-7",device="nvidia1",modelName="NVIDIA A100-SXM4-40GB",Hostname="b"'
    page = (
        f'DCGM_FI_DEV_GPU_UTIL{{{labels},GPU_I_PROFILE="1g.5gb",GPU_I_ID="8"}} 20\n'
        f'DCGM_FI_DEV_GPU_UTIL{{{labels},GPU_I_PROFILE="3g.20gb",GPU_I_ID="9"}} 70\n'
        f'DCGM_FI_DEV_FB_FREE{{{labels},GPU_I_PROFILE="1g.5gb",GPU_I_ID="8"}} 4000\n'
        f'DCGM_FI_DEV_FB_FREE{{{labels},GPU_I_PROFILE="3g.20gb",GPU_I_ID="9"}} 15000\n'
    )
    t = assemble(parse_exposition(page, 1.0, "", "Hostname", Counter())).nodes["b"]
    assert nan_eq(t.util_pct, (math.nan, 70.0)) and nan_eq(t.fb_free_mib, (math.nan, 19000.0))


def test_explicit_line_timestamp_wins_and_node_is_as_old_as_its_stalest_gpu() -> None:
    page = ('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="a"} 10 1700000000000\n'
            'DCGM_FI_DEV_GPU_UTIL{gpu="1",Hostname="a"} 10\n')
    t = assemble(parse_exposition(page, 1700000100.0, "", "Hostname", Counter())).nodes["a"]
    assert t.sampled_at == 1700000000.0


def test_pod_list_gives_targets_on_their_nodes() -> None:
    pods = {"items": [
        {"spec": {"nodeName": "n1"}, "status": {"phase": "Running", "podIP": "10.0.0.5"}},
        {"spec": {"nodeName": "n2"}, "status": {"phase": "Pending", "podIP": "10.0.0.6"}},
        {"spec": {}, "status": {"phase": "Running", "podIP": "10.0.0.7"}},
        {"spec": {"nodeName": "n4"}, "status": {"phase": "Running", "podIP": "fd00::4"}},
    ]}
    t = targets_from_pod_list(pods, CFG)
    assert [(x.url, x.node) for x in t] == [("http://10.0.0.5:9400/metrics", "n1"),
                                            ("http://[fd00::4]:9400/metrics", "n4")]


# ---- Prometheus query builder and answers ----

def test_query_selects_raw_samples_of_the_three_metrics_over_the_range() -> None:
    q = build_query(CFG)
    assert q == '{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_FB_FREE|DCGM_FI_DEV_FB_USED",Hostname!=""}[30000ms]'
    cfg = TelemetryConfig(source="prometheus", prometheus_url="http://p:9090/", node_label="kubernetes_node",
                          range_s=15, series_selector='cluster="gpu-a"', query_timeout_s=2.5)
    url, params = query_request(cfg)
    assert url == "http://p:9090/api/v1/query"
    assert params == {"query": '{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_FB_FREE|DCGM_FI_DEV_FB_USED",'
                               'kubernetes_node!="",cluster="gpu-a"}[15000ms]', "timeout": "2500ms"}


def _series(name: str, node: str, gpu: str, values: list[tuple[float, str]], **extra: str) -> dict[str, object]:
    # The shape of /api/v1/query's matrix result, labels as dcgm-exporter + Prometheus give them.
    metric = {"__name__": name, "gpu": gpu, "UUID": f"GPU-{node}-{gpu}", "device": f"nvidia{gpu}",
              "modelName": "Tesla T4", "Hostname": node, "DCGM_FI_DRIVER_VERSION": "460.106.00",
              "instance": "10.0.0.5:9400", "job": "dcgm", **extra}
    return {"metric": metric, "values": [[ts, v] for ts, v in values]}


def _answer(*series: dict[str, object]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": list(series)}}).encode()


def test_matrix_answer_is_averaged_with_the_newest_sample_time() -> None:
    body = _answer(
        _series(GPU_UTIL, "n1", "1", [(100.0, "80"), (101.0, "90"), (102.5, "100")], pod="p", namespace="ml"),
        _series(GPU_UTIL, "n1", "0", [(100.0, "0"), (101.0, "NaN"), (102.0, "2")]),
        _series(FB_FREE, "n1", "0", [(100.0, "15109"), (102.0, "15109")]),
        _series(GPU_UTIL, "n2", "0", [(99.0, "9223372036854775794")]),
    )
    r = parse_query_response(200, body, CFG)
    t = r.nodes["n1"]
    assert t.util_pct == (1.0, 90.0) and nan_eq(t.fb_free_mib, (15109.0, math.nan))
    assert t.sampled_at == 102.0  # the older GPU's newest sample; Prometheus' own timestamps
    assert "n2" not in r.nodes  # only a blank sentinel: no series, unknown
    assert r.bad_samples == {"not_finite": 1, "out_of_range": 1}
    assert r.pods == {"ml/p": (("n1", 1),)}


def test_node_label_instance_drops_the_port() -> None:
    body = _answer(_series(GPU_UTIL, "x", "0", [(1.0, "5")], instance="gpu-node-7:9400"))
    r = parse_query_response(200, body, TelemetryConfig(node_label="instance"))
    assert list(r.nodes) == ["gpu-node-7"]


@pytest.mark.parametrize(("status", "body", "reason"), [
    (400, b'{"status":"error","errorType":"bad_data","error":"parse error at char 3"}', "prometheus_error"),
    (503, b'{"status":"error","errorType":"timeout","error":"query timed out in expression evaluation"}',
     "prometheus_error"),
    (502, b"<html>bad gateway</html>", "bad_response"),
    (200, b'{"status":"success","data":{"resultType":"scalar","result":[1,"1"]}}', "bad_response"),
    (200, b"[]", "bad_response"),
])
def test_error_answers_raise(status: int, body: bytes, reason: str) -> None:
    with pytest.raises(TelemetryError) as e:
        parse_query_response(status, body, CFG)
    assert e.value.reason == reason


def test_malformed_rows_are_counted_not_fatal() -> None:
    good = _series(GPU_UTIL, "n1", "0", [(1.0, "5")])
    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        good, {"metric": "x"}, {"metric": {"__name__": GPU_UTIL, "gpu": "0"}, "values": [[1.0, "5"]]},
        {**good, "values": [["a", "b"], [2.0]]},
    ]}}).encode()
    r = parse_query_response(200, body, CFG)
    assert r.nodes["n1"].util_pct == (5.0,)
    assert r.bad_samples == {"malformed": 3, "no_node_label": 1}


def test_prometheus_source_needs_a_url() -> None:
    with pytest.raises(ValueError, match="prometheus_url"):
        TelemetryConfig(source="prometheus")


def test_pod_usage_vector_keeps_finite_non_negative_values_of_pods() -> None:
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"namespace": "ml", "pod": "a"}, "value": [1.0, "0.5"]},
        {"metric": {"pod": "b"}, "value": [1.0, "2"]},  # no namespace: default
        {"metric": {"namespace": "ml"}, "value": [1.0, "3"]},  # no pod: dropped
        {"metric": {"namespace": "ml", "pod": "c"}, "value": [1.0, "NaN"]},
        {"metric": {"namespace": "ml", "pod": "d"}, "value": [1.0, "-1"]},
        {"metric": {"namespace": "ml", "pod": "e"}, "value": "x"},
    ]}}).encode()
    assert parse_vector(200, body) == {("ml", "a"): 0.5, ("default", "b"): 2.0}
    with pytest.raises(TelemetryError, match="not an instant vector"):
        parse_vector(200, _answer())
