"""``omnilearn emulate --containers``: containers the user started with ``docker run`` get the level's
limits while the command runs, and their own limits back afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from omnilearn import config
from omnilearn.emulator.backends.docker import read_kernel
from omnilearn.emulator.protocol.audit import read_audit
from omnilearn.emulator.spec.plan import build_plan

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "pytorch")}
FIELDS = ("NanoCpus", "CpuQuota", "CpuPeriod", "CpusetCpus")

# What the user gave each container: Docker's two forms of a CPU limit, a cpuset alone, nothing.
STARTED_WITH = [{"nano_cpus": 1_500_000_000}, {"cpu_period": 50_000, "cpu_quota": 75_000},
                {"cpuset_cpus": "0"}, {}]

# The command under emulate: what the daemon and the kernel hold for each container while it runs;
# the last container burns 0.3 s of CPU; then it exits 3.
PROBE = """
import json, sys, docker
from omnilearn.emulator.backends.docker import read_kernel
client = docker.from_env()
seen = {}
for name in sys.argv[1:]:
    c = client.containers.get(name)
    seen[name] = {k: c.attrs["HostConfig"][k] for k in ("NanoCpus", "CpuQuota", "CpuPeriod", "CpusetCpus")}
    seen[name]["kernel"] = read_kernel(c.id)
burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.3: pass"
code, _ = client.containers.get(sys.argv[-1]).exec_run(["python", "-c", burn])
print("SEEN", json.dumps(seen), flush=True)
sys.exit(3 if code == 0 else 1)
"""


def limits(client, name: str) -> dict:
    c = client.containers.get(name)
    return {**{k: c.attrs["HostConfig"][k] for k in FIELDS}, "kernel": read_kernel(c.id)}


@pytest.fixture
def user_containers(docker_client, worker_image: str) -> Iterator[list[str]]:
    """Four containers started as a user would (``docker run -d``), removed afterwards."""
    tag = uuid.uuid4().hex[:8]
    names = [f"omnilearn-emu-{tag}-c{i + 1}" for i in range(len(STARTED_WITH))]
    try:
        for name, kwargs in zip(names, STARTED_WITH, strict=True):
            docker_client.containers.run(worker_image, ["sleep", "infinity"], name=name, detach=True, **kwargs)
        yield names
    finally:
        for name in names:
            try:
                docker_client.containers.get(name).remove(force=True)
            except Exception:  # noqa: BLE001 - never started
                pass


def emulate_argv(names: list[str], out: Path, *command: str) -> list[str]:
    return [sys.executable, "-m", "omnilearn", "emulate", "--hl", "HL8", "--workers", str(len(names)),
            "--containers", ",".join(names), "--out", str(out), "--", *command]


def emulate(names: list[str], out: Path, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(emulate_argv(names, out, *command), env=ENV, capture_output=True, text=True, timeout=180)


def assert_restored(client, names: list[str], before: dict[str, dict]) -> None:
    """The kernel's limits exactly as before; the daemon's record too, but that a quota never set (0)
    comes back as -1, Docker's other "no limit" (its update call reads 0 as "leave as is")."""
    for name in names:
        after = limits(client, name)
        assert after["kernel"] == before[name]["kernel"], name
        quota = before[name]["CpuQuota"] or (-1 if before[name]["NanoCpus"] == 0 else 0)
        assert after == {**before[name], "CpuQuota": quota}, name


def test_emulate_gives_user_containers_the_level_and_their_limits_back(tmp_path: Path, docker_client,
                                                                       user_containers: list[str]) -> None:
    names = user_containers
    before = {n: limits(docker_client, n) for n in names}
    assert before[names[0]]["NanoCpus"] == 1_500_000_000 and before[names[1]]["CpuQuota"] == 75_000

    # An unknown name among them: one line naming it, and no container touched.
    bad = emulate([*names[:3], "omnilearn-no-such-container"], tmp_path / "bad", sys.executable, "-c", "pass")
    assert bad.returncode == 2 and "'omnilearn-no-such-container'" in bad.stderr.strip().splitlines()[-1]
    assert {n: limits(docker_client, n) for n in names} == before and not (tmp_path / "bad").exists()

    out = tmp_path / "emu"
    proc = emulate(names, out, sys.executable, "-c", PROBE, *names)
    assert proc.returncode == 3, proc.stderr[-3000:]  # the command's own status
    seen = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("SEEN "))[5:])

    plan = build_plan(config.build(None, [("workers", 4), ("emulation.backend", "auto"), ("emulation.hl", "HL8")]))
    wanted = [plan.allocation("HL8", t).cpus for t in plan.targets]
    summary = json.loads((out / "summary.json").read_text())
    applied = {r["target"]: r["effective"]["cpus"] for r in read_audit(out / "logs", status="applied")}
    assert summary["containers"] == names
    for rank, (name, cpus) in enumerate(zip(names, wanted, strict=True)):
        now, kernel = seen[name], seen[name]["kernel"]
        assert int(kernel["quota"]) / int(kernel["period"]) == pytest.approx(cpus, abs=1e-3), name  # enforced
        assert applied[plan.targets[rank]] == pytest.approx(cpus, abs=1e-3)  # the toggler's read-back
        assert [a["cpus"] for a in summary["allocations"][rank]] == [applied[plan.targets[rank]]]
        if rank == 0:  # started with --cpus: changed as NanoCpus (Docker refuses a quota there)
            assert now["NanoCpus"] == round(cpus * 1e9) and now["CpuQuota"] == 0
        else:  # a quota against the container's own period
            period = before[name]["CpuPeriod"] or 100_000
            assert (now["CpuQuota"], now["CpuPeriod"]) == (round(cpus * period), before[name]["CpuPeriod"])
        assert now["CpusetCpus"] == before[name]["CpusetCpus"]  # HL8 has no cpusets: the user's is kept
    assert summary["cpu_seconds"][3] >= 0.25 and max(summary["cpu_seconds"][:3]) < 0.1

    assert_restored(docker_client, names, before)

    # Ctrl-C while the command runs: the command is stopped and the limits are given back all the same.
    out = tmp_path / "interrupted"
    proc = subprocess.Popen(emulate_argv(names, out, "sleep", "60"), env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(read_audit(out / "logs", status="applied")) < len(names) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.1)
        assert limits(docker_client, names[0])["NanoCpus"] == round(wanted[0] * 1e9)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_restored(docker_client, names, before)
