"""DRA objects (resource.k8s.io/v1) into per-node GPU counts and pod demands, on plain dicts."""

import pytest

from extender.snapshot.dra import (
    DeviceKind,
    parse_device_class,
    parse_resource_claim,
    parse_resource_slice,
)
from extender.snapshot.dra_book import DraBook
from extender.snapshot.objects import ObjectError, parse_pod, pod_claim_names
from tests.cluster import dra_objects as d

_BOTH = (d.device_class(), d.device_class("mig.nvidia.com", mig=True))


def _book(*slices: dict, classes: tuple[dict, ...] = (d.device_class(),)) -> DraBook:
    book = DraBook()
    for c in classes:
        book.upsert_class(parse_device_class(c))
    for s in slices:
        book.upsert_slice(parse_resource_slice(s))
    return book


def test_slice_devices_whole_and_mig() -> None:
    s = parse_resource_slice(d.resource_slice("n1", [d.gpu_device("n1", 0), d.mig_device("n1", 1, 0)]))
    assert (s.node, s.pool, s.driver) == ("n1", "n1", "gpu.nvidia.com")
    gpu, mig = s.devices
    assert gpu.kind == DeviceKind.GPU and gpu.uuid == d.gpu_uuid("n1", 0)
    assert gpu.product == "NVIDIA A100-SXM4-80GB" and gpu.architecture == "Ampere" and gpu.memory == 80 * 2**30
    assert mig.kind == DeviceKind.MIG and mig.parent_uuid == d.gpu_uuid("n1", 1) and mig.profile == "1g.10gb"


def test_slice_of_another_driver_has_no_gpu_devices() -> None:
    other = d.gpu_slice("n1")
    other["spec"]["driver"] = "net.example.com"
    assert parse_resource_slice(other).devices == ()


def test_qualified_attribute_names_are_read() -> None:
    dev = d.gpu_device("n1", 0)
    dev["attributes"] = {"gpu.nvidia.com/uuid": {"string": "GPU-x"}}
    assert parse_resource_slice(d.resource_slice("n1", [dev])).devices[0].uuid == "GPU-x"


@pytest.mark.parametrize("bad", [
    {"metadata": {}},
    {"metadata": {"name": "s"}, "spec": {"driver": "gpu.nvidia.com", "devices": "x"}},
    {"metadata": {"name": "s"}, "spec": {"driver": "gpu.nvidia.com", "devices": [{"attributes": {}}]}},
])
def test_malformed_slices_raise(bad: dict) -> None:
    with pytest.raises(ObjectError):
        parse_resource_slice(bad)


def test_device_classes() -> None:
    assert parse_device_class(d.device_class()).kind == DeviceKind.GPU
    assert parse_device_class(d.device_class("mig.nvidia.com", mig=True)).kind == DeviceKind.MIG
    custom = parse_device_class(d.device_class("big-gpus", extended_resource="example.com/gpu"))
    assert custom.kind == DeviceKind.GPU and custom.extended_resource == "example.com/gpu"
    other = parse_device_class({"metadata": {"name": "nic"}, "spec": {"selectors": [
        {"cel": {"expression": "device.driver == 'net.example.com'"}}]}})
    assert other.kind is None


def test_claim_requests_allocation_and_reservations() -> None:
    c = parse_resource_claim(d.allocated(d.resource_claim("c", "ns", count=2), "n1", ["gpu-0", "gpu-1"],
                                         (("p1", "u1"), ("p2", "u2"))))
    assert c.key == "ns/c" and c.node == "n1" and c.reserved_for == ("u1", "u2") and not c.extended
    (r,) = c.requests
    assert (r.device_class, r.count, r.all_devices) == ("gpu.nvidia.com", 2, False)
    assert [a.device for a in c.allocated] == ["gpu-0", "gpu-1"]
    every = parse_resource_claim(d.resource_claim("c", all_devices=True)).requests[0]
    assert every.all_devices and every.count == 1
    mig = parse_resource_claim(d.resource_claim("c", device_class_name="mig.nvidia.com", profile="3g.40gb"))
    assert mig.requests[0].profile == "3g.40gb"


def test_claim_first_available_reads_the_first_alternative() -> None:
    claim = {"metadata": {"name": "c"}, "spec": {"devices": {"requests": [{"name": "r", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 2},
        {"name": "small", "deviceClassName": "gpu.nvidia.com", "count": 1}]}]}}}
    assert parse_resource_claim(claim).requests[0].count == 2


def test_bad_claim_count_raises() -> None:
    claim = d.resource_claim("c")
    claim["spec"]["devices"]["requests"][0]["exactly"]["count"] = -1
    with pytest.raises(ObjectError):
        parse_resource_claim(claim)


def test_pod_claim_names_from_claims_and_templates() -> None:
    spec = {"resourceClaims": [{"name": "a", "resourceClaimName": "shared"},
                               {"name": "b", "resourceClaimTemplateName": "two-gpus"},
                               {"name": "c", "resourceClaimTemplateName": "pending"}]}
    status = {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-x1"}]}
    assert pod_claim_names(spec, status) == ("shared", "p-b-x1")  # "c": not generated yet
    assert pod_claim_names({}, {}) is None
    pod = parse_pod({"metadata": {"name": "p", "namespace": "ns"}, "spec": {**spec, "containers": []},
                     "status": status})
    assert pod.claims == ("shared", "p-b-x1") and pod.requests.gpus == 0


def test_node_capacity_and_a_shared_claim_counts_once() -> None:
    book = _book(d.gpu_slice("n1"), d.gpu_slice("n2"))
    assert book.node("n1").capacity == 4 and book.node("n1").used == 0
    shared = d.allocated(d.resource_claim("c", count=2), "n1", ["gpu-0", "gpu-1"], (("p1", "u1"), ("p2", "u2")))
    assert book.upsert_claim(parse_resource_claim(shared)) == {"n1"}
    assert (book.node("n1").used, book.node("n1").counted) == (2, 2)
    assert book.node("n2").used == 0
    # a re-sent claim does not count twice
    assert book.upsert_claim(parse_resource_claim(shared)) == set()
    assert book.delete_claim("default/c") == {"n1"} and book.node("n1").used == 0


def test_claim_seen_before_its_slice_is_placed_by_its_pool() -> None:
    book = DraBook()
    claim = d.allocated(d.resource_claim("c"), "n1", ["gpu-3"])
    del claim["status"]["allocation"]["nodeSelector"]
    book.upsert_claim(parse_resource_claim(claim))
    assert book.node("n1") is None
    assert book.upsert_slice(parse_resource_slice(d.gpu_slice("n1"))) == {"n1"}
    assert (book.node("n1").capacity, book.node("n1").used) == (4, 1)


def test_extended_resource_claims_count_once() -> None:
    # The pods' own nvidia.com/gpu requests count what kube-scheduler's claim for them holds.
    book = _book(d.gpu_slice("n1"), classes=(d.device_class(extended_resource="nvidia.com/gpu"),))
    book.upsert_claim(parse_resource_claim(d.allocated(d.resource_claim("p-gpu"), "n1", ["gpu-0"], extended=True)))
    assert (book.node("n1").used, book.node("n1").counted) == (1, 0)
    # Mapped from another name (which the snapshot does not read from pods): the claim counts.
    assert book.upsert_class(parse_device_class(d.device_class(extended_resource="example.com/gpu"))) == {"n1"}
    assert (book.node("n1").used, book.node("n1").counted) == (1, 1)


def test_mig_slices_capacity_and_free_profiles() -> None:
    devices = [d.gpu_device("n1", 0)] + [d.mig_device("n1", 1, s) for s in range(3)] \
        + [d.mig_device("n1", 2, 0, "3g.40gb")]
    book = _book(d.resource_slice("n1", devices), classes=_BOTH)
    n = book.node("n1")
    assert n.capacity == 3  # GPU 0 whole, GPUs 1 and 2 partitioned
    assert dict(n.free_mig) == {"1g.10gb": 3, "3g.40gb": 1}
    claim = d.resource_claim("m", device_class_name="mig.nvidia.com", profile="3g.40gb")
    book.upsert_claim(parse_resource_claim(d.allocated(claim, "n1", ["gpu-2-mig-3g-40gb-0"])))
    n = book.node("n1")
    assert dict(n.free_mig) == {"1g.10gb": 3} and n.used == 1


def test_pod_demand_from_its_claims() -> None:
    book = _book(d.gpu_slice("n1"), classes=_BOTH)
    book.upsert_claim(parse_resource_claim(d.resource_claim("two", count=2)))
    book.upsert_claim(parse_resource_claim(d.resource_claim("mig", device_class_name="mig.nvidia.com",
                                                            profile="1g.10gb")))
    book.upsert_claim(parse_resource_claim(d.allocated(d.resource_claim("done"), "n1", ["gpu-0"])))
    dem = book.demand("default", ["two", "mig", "done", "unknown"])
    assert dem.gpus == 2 and dict(dem.mig) == {"1g.10gb": 1} and dem.claims == 3


def test_extended_resource_names_follow_the_classes() -> None:
    book = _book(classes=(d.device_class("big", extended_resource="example.com/gpu"),))
    assert book.extended_resources == {"example.com/gpu", "deviceclass.resource.kubernetes.io/big"}
    book.delete_class("big")
    assert book.extended_resources == frozenset()


def test_a_shared_claim_frees_only_when_all_its_pods_go() -> None:
    book = _book(d.gpu_slice("n1"))
    book.upsert_claim(parse_resource_claim(d.allocated(d.resource_claim("c", count=2), "n1", ["gpu-0", "gpu-1"],
                                                       (("p1", "u1"), ("p2", "u2")))))
    assert book.frees(["default/c"], {"u1"}) == {}
    assert book.frees(["default/c"], {"u1", "u2"}) == {"n1": 2}


def test_uuid_lookup_and_relist() -> None:
    book = _book(d.gpu_slice("n1"), d.gpu_slice("n2"))
    node, dev = book.device(d.gpu_uuid("n2", 3))
    assert node == "n2" and dev.name == "gpu-3"
    assert book.replace_all("resourceslices", [parse_resource_slice(d.gpu_slice("n1"))]) == {"n2"}
    assert book.device(d.gpu_uuid("n2", 3)) is None and book.node("n2") is None


def test_named_requests_sum_containers_and_take_the_largest_init_container() -> None:
    from extender.snapshot.objects import named_requests

    implicit = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
    spec = {"containers": [{"resources": {"limits": {implicit: "2", "nvidia.com/gpu": "1"}}},
                           {"resources": {"requests": {"example.com/gpu": "1"}, "limits": {"example.com/gpu": "1"}}},
                           {"name": "no-resources"}],
            "initContainers": [{"resources": {"limits": {implicit: "4"}}}]}
    names = frozenset({implicit, "example.com/gpu", "nvidia.com/gpu"})
    assert named_requests(spec, names, skip="nvidia.com/gpu") == 4.0
    assert named_requests({"containers": [{"resources": {"limits": {implicit: "1"}}}]}, names) == 1.0
    assert named_requests({}, names) == 0.0
