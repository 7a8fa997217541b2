"""omnilearn emulate around a command: its rank processes in the level's cgroups, status passed through."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omnilearn.config.sections import EmulationConfig
from omnilearn.emulator.backends.cgroupfs import cfs_limits

ROOT = Path(__file__).resolve().parents[1]

# The rank process reports the CPU quota and period of the cgroup it finds itself in, then exits 3.
PROBE = """
import sys, time
from pathlib import Path
time.sleep(1.5)  # emulate scans every 0.2 s: it has found this process by now
path = [l.split(':', 2)[2] for l in Path('/proc/self/cgroup').read_text().splitlines() if l.split(':')[1] == 'cpu'][0]
cpu = Path('/sys/fs/cgroup/cpu' + path)
print('CGROUP', path, (cpu / 'cpu.cfs_quota_us').read_text().strip(), (cpu / 'cpu.cfs_period_us').read_text().strip(),
      flush=True)
sys.exit(3)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/sys/fs/cgroup/cpu").is_dir(), reason="needs root and cgroup v1")
def test_emulate_places_the_rank_in_its_cgroup_and_passes_the_exit_status(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "pytorch"), "RANK": "0"}
    out = tmp_path / "emu"
    proc = subprocess.run([sys.executable, "-m", "omnilearn", "emulate", "--hl", "HL8", "--workers", "1",
                           "--out", str(out), "--", sys.executable, "-c", PROBE],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-2000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("CGROUP")][0].split()
    assert line[1].startswith("/omnilearn/")
    summary = json.loads((out / "summary.json").read_text())
    cpus = summary["allocations"][0][0]["cpus"]
    # The level's allocation, as the kernel holds it, against the emulator's CFS period.
    assert (int(line[2]), int(line[3])) == cfs_limits(cpus, EmulationConfig().cpu_period_us)
    assert not Path("/sys/fs/cgroup/cpu" + line[1]).exists()  # removed afterwards
    assert summary["cpu_seconds"][0] > 0
    assert summary["busy_seconds"][0] > 0  # ran or waited for a CPU, from the kernel's schedstat


def test_emulate_without_a_command_is_a_user_error(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "pytorch")}
    proc = subprocess.run([sys.executable, "-m", "omnilearn", "emulate", "--hl", "HL8", "--out", str(tmp_path / "x")],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "give a command" in proc.stderr



@pytest.mark.parametrize(("args", "culprit"), [
    (["--workers", "3", "--containers", "c1,c2"], "--containers names 2 containers but --workers is 3"),
    (["--containers", "c1,,c2"], "an empty name"),
    (["--containers", "c1,c2,c1"], "'c1' is named twice"),
])
def test_emulate_containers_bad_input_is_one_user_error(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                        args: list[str], culprit: str) -> None:
    from omnilearn.cli import main

    out = tmp_path / "x"
    assert main(["emulate", "--hl", "HL8", *args, "--out", str(out), "--", sys.executable, "-c", "pass"]) == 2
    lines = capfd.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("omnilearn: error: ") and culprit in lines[0]
    assert not out.exists()


def test_emulate_containers_without_a_daemon_names_it(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from omnilearn.cli import main

    sock = tmp_path / "no-docker.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
    out = tmp_path / "x"
    assert main(["emulate", "--hl", "HL8", "--containers", "c1,c2", "--out", str(out), "--", "true"]) == 2
    assert capfd.readouterr().err.strip() == (f"omnilearn: error: --containers: no Docker daemon at unix://{sock}: "
                                               f"start it with ./docker_install.sh")
    assert not out.exists()
