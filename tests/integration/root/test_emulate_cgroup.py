"""omnilearn emulate places a command's rank in its cgroup (root, cgroup v1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omnilearn.config.sections import EmulationConfig
from omnilearn.emulator.backends.cgroupfs import cfs_limits

# The rank process reports the CPU quota and period of the cgroup it finds itself in, then exits 3.
ROOT = Path(__file__).resolve().parents[3]
PROBE = """
import sys, time
from pathlib import Path
time.sleep(1.5)  # emulate scans every 0.2 s: it has found this process by now
path = [l.split(':', 2)[2] for l in Path('/proc/self/cgroup').read_text().splitlines() if l.split(':')[1] == 'cpu'][0]
cpu = Path('/sys/fs/cgroup/cpu' + path)
print('CGROUP', path, (cpu / 'cpu.cfs_quota_us').read_text().strip(), (cpu / 'cpu.cfs_period_us').read_text().strip(),
      flush=True)
start = time.process_time()
while time.process_time() - start < 0.3:  # CPU time the emulator's scans can see (ticks of 10 ms)
    pass
time.sleep(1.0)  # scanned again after the work
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
    assert summary["straggler_scores"] == [{"relative": 1.0, "individual": 1.0}]  # the only rank, from busy time


PINNED = """
import os, sys, time
from pathlib import Path
time.sleep(1.5)  # found by emulate's scans by now
path = [l.split(':', 2)[2] for l in Path('/proc/self/cgroup').read_text().splitlines() if l.split(':')[1] == 'cpu'][0]
cpu = Path('/sys/fs/cgroup/cpu' + path)
print('PINNED', (cpu / 'cpu.cfs_quota_us').read_text().strip(), (cpu / 'cpu.cfs_period_us').read_text().strip(),
      ','.join(map(str, sorted(os.sched_getaffinity(0)))), flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/sys/fs/cgroup/cpu").is_dir(), reason="needs root and cgroup v1")
def test_emulate_levels_file_puts_a_quota_on_a_cpuset(tmp_path: Path) -> None:
    last = max(os.sched_getaffinity(0))
    levels = tmp_path / "levels.yaml"
    levels.write_text(f"SKEW: [{{cpuset: '{last}', cpus: 0.25}}]\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "pytorch"), "RANK": "0"}
    proc = subprocess.run([sys.executable, "-m", "omnilearn", "emulate", "--levels", str(levels), "--hl", "SKEW",
                           "--workers", "1", "--out", str(tmp_path / "emu"), "--", sys.executable, "-c", PINNED],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("PINNED")][0].split()
    assert (int(line[1]), int(line[2])) == cfs_limits(0.25, EmulationConfig().cpu_period_us)
    assert line[3] == str(last)  # the kernel's cpuset holds the rank to that core
    # A table for other ranks than the command's: one line naming the file, nothing started.
    bad = subprocess.run([sys.executable, "-m", "omnilearn", "emulate", "--levels", str(levels), "--hl", "SKEW",
                          "--workers", "2", "--out", str(tmp_path / "bad"), "--", sys.executable, "-c", "pass"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"omnilearn: error: --levels {levels}: <defaults> (with command-line overrides): "
        f"emulation.levels.SKEW: has 1 entries for 2 workers"]
    assert not (tmp_path / "bad").exists()
