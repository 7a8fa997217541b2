"""The Docker backend's translation of allocations, without a daemon."""

from __future__ import annotations

import pytest

from omnilearn.emulator.backends.docker import (
    DockerBackend,
    ForeignContainer,
    effective_allocation,
    run_kwargs,
    update_kwargs,
)
from omnilearn.emulator.levels import Allocation
from omnilearn.train.distributed import select_interface


def test_update_kwargs_quota_cpuset_and_unlimited() -> None:
    assert update_kwargs(Allocation(cpus=0.25), 2) == {"cpu_period": 100_000, "cpu_quota": 25_000,
                                                       "cpuset_cpus": "0-1"}
    assert update_kwargs(Allocation(cpuset="1"), 2)["cpuset_cpus"] == "1"
    assert update_kwargs(Allocation(cpuset="1"), 2)["cpu_quota"] == -1  # lifts a previous quota
    assert update_kwargs(Allocation(cpus=1.0, memory=2**30), 4)["mem_limit"] == 2**30
    assert run_kwargs(Allocation()) == {}
    assert run_kwargs(Allocation(cpus=1.3333)) == {"cpu_period": 100_000, "cpu_quota": 133_330}


def test_effective_allocation_prefers_the_kernel() -> None:
    attrs = {"HostConfig": {"CpuQuota": 50_000, "CpuPeriod": 100_000, "CpusetCpus": "0-1"}}
    assert effective_allocation(attrs) == Allocation(cpuset="0-1", cpus=0.5)
    kernel = {"quota": "25000", "period": "100000", "cpuset": "1"}
    assert effective_allocation(attrs, kernel) == Allocation(cpuset="1", cpus=0.25)
    assert effective_allocation({"HostConfig": {"CpuQuota": -1}}, None).cpus is None


class FakeContainer:
    def __init__(self, name: str, job: str | None) -> None:
        self.name, self.labels, self.updated = name, ({"omnilearn.job": job} if job else {}), None

    def update(self, **kwargs) -> None:
        self.updated = kwargs


class FakeClient:
    def __init__(self, containers: dict[str, FakeContainer]) -> None:
        self.containers = self
        self._c = containers

    def get(self, name: str) -> FakeContainer:
        return self._c[name]


def test_backend_refuses_containers_of_other_jobs() -> None:
    client = FakeClient({"worker1": FakeContainer("worker1", "other-job"), "worker2": FakeContainer("worker2", None)})
    backend = DockerBackend("my-job", client, host_cpus={"worker1": 2, "worker2": 2})
    for name in ("worker1", "worker2"):
        with pytest.raises(ForeignContainer):
            backend.apply(name, Allocation(cpus=0.5))
        assert client.get(name).updated is None


def test_overlay_interface_is_found_by_subnet() -> None:
    assert select_interface("127.0.0.0/8") == "lo"
    assert select_interface("203.0.113.0/24") is None


def test_container_end_times_are_parsed_to_the_nanosecond_docker_gives() -> None:
    import math

    from omnilearn.launch.docker.swarm import finished_at

    a = finished_at("2026-11-22T10:33:07.123456789Z")
    b = finished_at("2026-11-22T10:33:07.123457Z")
    assert 0 < b - a < 1e-5 and finished_at("2026-11-22T11:33:07+01:00") == finished_at("2026-11-22T10:33:07Z")
    assert finished_at("0001-01-01T00:00:00Z") == math.inf and finished_at("") == math.inf
    assert finished_at("yesterday") == math.inf
