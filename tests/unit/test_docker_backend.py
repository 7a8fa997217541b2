"""The Docker backend's translation of allocations, without a daemon."""

from __future__ import annotations

import pytest

from fakes import FakeClock
from omnilearn.emulator.backends.docker import (
    DockerBackend,
    ForeignContainer,
    effective_allocation,
    run_kwargs,
    update_kwargs,
)
from omnilearn.emulator.spec.levels import Allocation
from omnilearn.train.distributed import select_interface


def test_update_kwargs_quota_cpuset_and_unlimited() -> None:
    assert update_kwargs(Allocation(cpus=0.25), 2) == {"cpu_period": 10_000, "cpu_quota": 2_500,
                                                       "cpuset_cpus": "0-1"}
    # A quota under the kernel's 1 ms stretches the period; a period asked for is kept otherwise.
    assert update_kwargs(Allocation(cpus=0.05), 2)["cpu_period"] == 20_000
    assert update_kwargs(Allocation(cpus=0.05), 2)["cpu_quota"] == 1_000
    assert update_kwargs(Allocation(cpus=0.25), 2, period_us=100_000)["cpu_quota"] == 25_000
    assert update_kwargs(Allocation(cpuset="1"), 2)["cpuset_cpus"] == "1"
    assert update_kwargs(Allocation(cpuset="1"), 2)["cpu_quota"] == -1  # lifts a previous quota
    assert update_kwargs(Allocation(cpus=1.0, memory=2**30), 4)["mem_limit"] == 2**30
    assert run_kwargs(Allocation()) == {}
    assert run_kwargs(Allocation(cpus=1.3333)) == {"cpu_period": 10_000, "cpu_quota": 13_333}
    assert run_kwargs(Allocation(cpus=1.3333), 50_000) == {"cpu_period": 50_000, "cpu_quota": 66_665}


def test_effective_allocation_prefers_the_kernel() -> None:
    attrs = {"HostConfig": {"CpuQuota": 50_000, "CpuPeriod": 100_000, "CpusetCpus": "0-1"}}
    assert effective_allocation(attrs) == Allocation(cpuset="0-1", cpus=0.5)
    kernel = {"quota": "25000", "period": "100000", "cpuset": "1"}
    assert effective_allocation(attrs, kernel) == Allocation(cpuset="1", cpus=0.25)
    assert effective_allocation({"HostConfig": {"CpuQuota": -1}}, None).cpus is None


class FakeContainer:
    def __init__(self, name: str, job: str | None) -> None:
        self.name, self.labels, self.updated = name, ({"omnilearn.job": job} if job else {}), None
        self.id, self.attrs = f"fake-{name}", {"HostConfig": {"CpuQuota": 50_000, "CpuPeriod": 100_000}}

    def update(self, **kwargs) -> None:
        self.updated = kwargs

    def reload(self) -> None:
        pass


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
        with pytest.raises(ForeignContainer):  # nor read back: the toggler records "unknown"
            backend.current(name)


def test_backend_reads_back_what_is_in_force_without_changing_it() -> None:
    client = FakeClient({"worker1": FakeContainer("worker1", "my-job")})
    backend = DockerBackend("my-job", client, host_cpus={"worker1": 2})
    assert backend.current("worker1") == Allocation(cpus=0.5) and client.get("worker1").updated is None


def test_user_containers_keep_their_form_of_cpu_limit_and_get_it_back() -> None:
    from omnilearn.emulator.backends.docker_user import Limits, cpu_update, restore_update

    nano = Limits.of({"HostConfig": {"NanoCpus": 1_500_000_000, "CpuQuota": 0, "CpuPeriod": 0}})
    quota = Limits.of({"HostConfig": {"CpuQuota": 75_000, "CpuPeriod": 50_000, "CpusetCpus": "0"}})
    free = Limits.of({"HostConfig": {}})
    assert cpu_update(nano, 0.25, 2) == {"NanoCpus": 250_000_000}  # Docker refuses a quota once --cpus is set
    assert cpu_update(nano, None, 2) == {"NanoCpus": 2_000_000_000}  # NanoCpus cannot be lifted: the whole host
    assert cpu_update(quota, 0.25, 2) == {"CpuQuota": 12_500}  # against the container's own period
    assert cpu_update(free, 1.3333, 2) == {"CpuQuota": 133_330} and cpu_update(free, None, 2) == {"CpuQuota": -1}
    assert restore_update(nano, 2) == {"NanoCpus": 1_500_000_000, "CpusetCpus": "0-1"}
    assert restore_update(quota, 2) == {"CpuQuota": 75_000, "CpusetCpus": "0"}
    assert restore_update(free, 4) == {"CpuQuota": -1, "CpusetCpus": "0-3"}


def test_overlay_interface_is_found_by_subnet() -> None:
    assert select_interface("127.0.0.0/8") == "lo"
    assert select_interface("203.0.113.0/24") is None


def test_container_end_times_are_parsed_to_the_nanosecond_docker_gives() -> None:
    import math

    from omnilearn.launch.docker.containers import finished_at

    a = finished_at("2026-11-22T10:33:07.123456789Z")
    b = finished_at("2026-11-22T10:33:07.123457Z")
    assert 0 < b - a < 1e-5 and finished_at("2026-11-22T11:33:07+01:00") == finished_at("2026-11-22T10:33:07Z")
    assert finished_at("0001-01-01T00:00:00Z") == math.inf and finished_at("") == math.inf
    assert finished_at("yesterday") == math.inf


# ---------------------------------------------------------------- read-back from the container's cgroup


CID = "0123456789abcdef" * 4


def _files(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


@pytest.mark.parametrize("layout, files, expected", [
    ("cgroup v2, systemd driver", {
        "cgroup.controllers": "cpuset cpu io memory pids",
        f"system.slice/docker-{CID}.scope/cpu.max": "25000 100000",
        f"system.slice/docker-{CID}.scope/cpuset.cpus": "",
        f"system.slice/docker-{CID}.scope/cpuset.cpus.effective": "0-1"},
     {"quota": "25000", "period": "100000", "cpuset": "0-1"}),
    ("cgroup v2, cgroupfs driver, no quota", {
        "cgroup.controllers": "cpuset cpu",
        f"docker/{CID}/cpu.max": "max 100000",
        f"docker/{CID}/cpuset.cpus.effective": "1"},
     {"quota": "-1", "period": "100000", "cpuset": "1"}),
    ("cgroup v1, systemd driver", {
        f"cpu/system.slice/docker-{CID}.scope/cpu.cfs_quota_us": "133330",
        f"cpu/system.slice/docker-{CID}.scope/cpu.cfs_period_us": "100000",
        f"cpuset/system.slice/docker-{CID}.scope/cpuset.cpus": "0-1"},
     {"quota": "133330", "period": "100000", "cpuset": "0-1"}),
    ("cgroup v1, cgroupfs driver", {
        f"cpu/docker/{CID}/cpu.cfs_quota_us": "50000",
        f"cpu/docker/{CID}/cpu.cfs_period_us": "100000",
        f"cpuset/docker/{CID}/cpuset.cpus": "0"},
     {"quota": "50000", "period": "100000", "cpuset": "0"}),
])
def test_read_back_finds_the_container_in_every_cgroup_layout(tmp_path, layout: str, files: dict, expected: dict
                                                               ) -> None:
    from omnilearn.emulator.backends.docker import read_kernel

    _files(tmp_path, files)
    assert read_kernel(CID, tmp_path) == expected, layout
    assert read_kernel("f" * 64, tmp_path) is None  # not visible on this host: the daemon's record is used
    attrs = {"HostConfig": {"CpuQuota": 99_000, "CpuPeriod": 100_000}}
    assert effective_allocation(attrs, read_kernel(CID, tmp_path)).cpus == (
        None if expected["quota"] == "-1" else int(expected["quota"]) / 100_000)


def test_a_stall_pauses_the_container_and_close_unpauses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from omnilearn.emulator.backends import pauses

    clock = FakeClock()
    monkeypatch.setattr(pauses, "Timer", clock.timer)

    class Pausable(FakeContainer):
        def __init__(self) -> None:
            super().__init__("worker1", "my-job")
            self.calls: list[str] = []

        def pause(self) -> None:
            self.calls.append("pause")

        def unpause(self) -> None:
            self.calls.append("unpause")

    c = Pausable()
    backend = DockerBackend("my-job", FakeClient({"worker1": c}))
    backend.stall("worker1", 0.05)
    assert c.calls == ["pause"]
    clock.advance(0.04)
    assert c.calls == ["pause"]
    clock.advance(0.01)
    assert c.calls == ["pause", "unpause"]
    backend.stall("worker1", 60)
    backend.close()  # never leaves a container paused
    assert c.calls == ["pause", "unpause", "pause", "unpause"]
