"""benchmarks/fgd: the arrival sequence and the replay's bookkeeping on a small synthetic list."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.fgd.policies import POLICY_NAMES
from benchmarks.fgd.replay import replay
from benchmarks.fgd.workload import arrivals, read_nodes, read_pods


def _write(tmp: Path) -> Path:
    (tmp / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"n{i},32000,262144,{4 if i % 2 else 2},{'T4' if i % 3 else 'V100'}\n" for i in range(40)))
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"]
    rng = np.random.default_rng(0)
    for i in range(100):
        g, m = [(1, 500), (1, 250), (1, 1000), (2, 1000), (0, 0)][int(rng.integers(5))]
        spec = "T4" if i % 7 == 0 and g else ""
        rows.append(f"p{i},{int(rng.integers(1, 8)) * 1000},1024,{g},{m},{spec}")
    (tmp / "openb_pod_list_default.csv").write_text("\n".join(rows) + "\n")
    return tmp


def test_arrivals_top_up_to_the_tune_ratio_and_keep_every_pod(tmp_path: Path) -> None:
    d = _write(tmp_path)
    nodes, pods = read_nodes(d), read_pods(d, "default")
    seq = arrivals(pods, nodes.total_gpu_milli, np.random.default_rng(1), 1.3)
    assert seq.count >= pods.count
    assert int(seq.total_milli.sum()) <= 1.3 * nodes.total_gpu_milli
    again = arrivals(pods, nodes.total_gpu_milli, np.random.default_rng(1), 1.3)
    assert np.array_equal(seq.gpu_milli, again.gpu_milli) and seq.spec == again.spec


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_allocates_within_capacity(tmp_path: Path, policy: str) -> None:
    d = _write(tmp_path)
    nodes, pods = read_nodes(d), read_pods(d, "default")
    r = replay(nodes, pods, policy, seed=3, at=(60, 100))
    for x in (60, 100):
        assert 0.0 < r.alloc_pct[x] <= x + 1.0  # at most what arrived (bucket is +-0.5 %)
        assert r.unalloc_gpus[x] >= 0.0
    assert r.failed_pods >= 0 and r.pods_arrived > 0


def test_pod_list_with_a_fraction_of_several_gpus_is_refused(tmp_path: Path) -> None:
    d = _write(tmp_path)
    (d / "openb_pod_list_bad.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1,2,500\n")
    with pytest.raises(ValueError, match="fraction of more than one GPU"):
        read_pods(d, "bad")
