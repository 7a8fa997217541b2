"""Extra Docker daemons on this host, each in its own network namespace: the "hosts" of a multi-host test.

Each daemon runs ``dockerd`` under ``nsenter --net`` (only its network namespace differs from the
host's: it shares the file system, so the test's launcher reaches it by a unix socket) with its own
address, data root, exec root, pid file and socket. The namespaces are joined by one veth pair (two
daemons) and nothing is added to the host's own network namespace: no bridge, no iptables rule, no
route. :meth:`Farm.close` takes everything down (containers, swarm membership, daemons and their
containerd, mounts under their roots, the roots, the namespaces) and is safe after a setup that
failed halfway; :meth:`Farm.leftovers` says what is still there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUBNET = "10.213.0"
STORE = "image/overlay2"


def link_image(src_root: Path, dst_root: Path, image_id: str, tags: list[str]) -> None:
    """Give a daemon that has not started yet (data root ``dst_root``) the image ``image_id`` of another
    daemon's overlay2 store (``src_root``) by hard links: the same files, no copy (an image's layers
    are never written once committed: containers write to layers of their own). What ``docker load``
    would write, in seconds instead of minutes; OSError where the roots are on different file systems."""
    hex_id = image_id.removeprefix("sha256:")
    config = json.loads((src_root / STORE / "imagedb/content/sha256" / hex_id).read_bytes())
    chain: list[str] = []
    for diff in config["rootfs"]["diff_ids"]:
        chain.append(diff if not chain else "sha256:" + hashlib.sha256(f"{chain[-1]} {diff}".encode()).hexdigest())
    (dst_root / "overlay2/l").mkdir(parents=True)
    for chain_id in chain:
        rel = Path(STORE, "layerdb/sha256", chain_id.removeprefix("sha256:"))
        shutil.copytree(src_root / rel, dst_root / rel)
        cache = (src_root / rel / "cache-id").read_text().strip()
        _run("cp", "-al", str(src_root / "overlay2" / cache), str(dst_root / "overlay2" / cache), timeout=300)
        short = (src_root / "overlay2" / cache / "link").read_text().strip()
        os.symlink(f"../{cache}/diff", dst_root / "overlay2/l" / short)
    for part in ("content", "metadata"):
        rel = Path(STORE, "imagedb", part, "sha256", hex_id)
        if (src_root / rel).exists():
            (dst_root / rel).parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if (src_root / rel).is_dir() else shutil.copy2)(src_root / rel, dst_root / rel)
    repos: dict[str, dict[str, str]] = {}
    for tag in tags:
        repos.setdefault(tag.rpartition(":")[0], {})[tag] = f"sha256:{hex_id}"
    (dst_root / STORE / "repositories.json").write_text(json.dumps({"Repositories": repos}))


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie child of ours is as good as gone
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _stop(pid: int, timeout: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@dataclass
class Daemon:
    index: int
    netns: str
    addr: str
    data_root: Path
    exec_root: Path
    proc: subprocess.Popen | None = None
    client: Any = None

    @property
    def url(self) -> str:
        return f"unix://{self.exec_root}.sock"

    @property
    def log(self) -> Path:
        return Path(f"{self.exec_root}.log")

    def containerd_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int((self.exec_root / "containerd" / "containerd.pid").read_text())
        return None


@dataclass
class Farm:
    """``n`` extra daemons named by ``tag`` (short: it names interfaces and namespaces)."""

    tag: str
    base: Path  # the data roots go under it (made here, removed by close)
    n: int = 2
    daemons: list[Daemon] = field(default_factory=list)
    linked_s: float | None = 0.0
    namespaces: list[str] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        run = Path("/run") / self.tag  # short: containerd's sockets live under the exec root
        self.run_dir = run
        self.daemons = [Daemon(i, f"{self.tag}-{i}", f"{SUBNET}.{i + 1}", self.base / f"d{i}", run / f"d{i}")
                        for i in range(self.n)]

    def start(self, docker_sdk: Any, join_script: Path, image: tuple[Path, str, list[str]] | None = None,
              timeout: float = 90) -> None:
        """Make the namespaces, start the daemons, and join them in one swarm, the first its manager, with
        ``join_script`` (scripts/swarm_join.sh). ``image``: (another daemon's data root, image id, tags) to
        give every daemon by :func:`link_image` first (:attr:`linked_s`: the seconds it took; None where
        it could not)."""
        assert self.n == 2, "one veth pair joins two namespaces"
        for folder in (self.run_dir, self.base):
            folder.mkdir(parents=True)  # fails if there: close() removes only what this farm made
            self.folders.append(folder)
        config = self.run_dir / "daemon.json"
        config.write_text("{}\n")  # not the host daemon's /etc/docker/daemon.json
        a, b = self.daemons
        for d in self.daemons:
            _run("ip", "netns", "add", d.netns)
            self.namespaces.append(d.netns)  # only what this farm made is removed
        _run("ip", "link", "add", f"{self.tag}a", "type", "veth", "peer", "name", f"{self.tag}b")
        for d, end in ((a, f"{self.tag}a"), (b, f"{self.tag}b")):
            _run("ip", "link", "set", end, "netns", d.netns)
            _run("ip", "-n", d.netns, "addr", "add", f"{d.addr}/24", "dev", end)
            _run("ip", "-n", d.netns, "link", "set", end, "up")
            _run("ip", "-n", d.netns, "link", "set", "lo", "up")
        started = time.monotonic()
        for d in self.daemons:
            d.exec_root.mkdir(parents=True)
            try:
                if image is None:
                    raise OSError("no image to link")
                link_image(image[0], d.data_root, image[1], image[2])
            except (OSError, subprocess.SubprocessError, KeyError, ValueError):
                shutil.rmtree(d.data_root, ignore_errors=True)
                self.linked_s = None
            d.data_root.mkdir(parents=True, exist_ok=True)
        if self.linked_s is not None:
            self.linked_s = time.monotonic() - started
        for d in self.daemons:
            with open(d.log, "wb") as log:
                d.proc = subprocess.Popen(
                    ["nsenter", f"--net=/run/netns/{d.netns}", "dockerd", "--data-root", str(d.data_root),
                     "--exec-root", str(d.exec_root), "--pidfile", f"{d.exec_root}.pid", "-H", d.url,
                     "--config-file", str(config), "--swarm-default-advertise-addr", d.addr],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        for d in self.daemons:
            d.client = self._wait(docker_sdk, d, timeout)
        _run(str(join_script), "--manager", a.url, "--advertise-addr", a.addr, f"{b.url}={b.addr}")

    @staticmethod
    def _wait(docker_sdk: Any, d: Daemon, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            if d.proc is not None and d.proc.poll() is not None:
                raise RuntimeError(f"dockerd {d.index} ended ({d.proc.returncode}): {d.log.read_text()[-2000:]}")
            with contextlib.suppress(Exception):
                client = docker_sdk.DockerClient(base_url=d.url, timeout=120)
                client.ping()
                return client
            if time.monotonic() > deadline:
                raise RuntimeError(f"dockerd {d.index} does not answer at {d.url}: {d.log.read_text()[-2000:]}")
            time.sleep(0.3)

    def load_image(self, image: str, daemons: list[Daemon]) -> float:
        """``docker save`` once into the daemons' ``docker load`` at the same time; returns the seconds."""
        started = time.monotonic()
        loads = [subprocess.Popen(["docker", "-H", d.url, "load", "--quiet"], stdin=subprocess.PIPE,
                                  stdout=subprocess.DEVNULL) for d in daemons]
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        try:
            assert save.stdout is not None
            while chunk := save.stdout.read(1 << 20):
                for p in loads:
                    assert p.stdin is not None
                    p.stdin.write(chunk)
        finally:
            for p in loads:
                with contextlib.suppress(OSError):
                    p.stdin.close()  # type: ignore[union-attr]
            codes = [save.wait(timeout=60)] + [p.wait(timeout=600) for p in loads]
        if any(codes):
            raise RuntimeError(f"docker save | load of {image}: exit codes {codes}")
        return time.monotonic() - started

    def close(self) -> None:
        """Take down everything :meth:`start` made, whatever it got to; never raises."""
        for d in reversed(self.daemons):  # workers leave before the manager
            if d.client is None:
                continue
            with contextlib.suppress(Exception):
                for c in d.client.containers.list(all=True):
                    c.remove(force=True)
            with contextlib.suppress(Exception):
                d.client.swarm.leave(force=True)
            with contextlib.suppress(Exception):
                d.client.close()
        for d in self.daemons:
            containerd = d.containerd_pid()
            if d.proc is not None:
                _stop(d.proc.pid, 30)
                with contextlib.suppress(Exception):
                    d.proc.wait(timeout=10)
            if containerd is not None and _alive(containerd):
                _stop(containerd, 10)
        for mount in sorted(self._mounts(), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        for netns in self.namespaces:  # with them the veth pair between them
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)

    def _roots(self) -> list[str]:
        return [str(self.run_dir), str(self.base)]

    def _mounts(self) -> list[str]:
        points = []
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/mountinfo").read_text().splitlines():
                point = line.split()[4].replace("\\040", " ")
                if any(point == r or point.startswith(r + "/") for r in self._roots()):
                    points.append(point)
        return points

    def leftovers(self) -> list[str]:
        """What :meth:`close` should have removed and is still there."""
        out = [f"mount {m}" for m in self._mounts()]
        out += [f"folder {r}" for r in self._roots() if Path(r).exists()]
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        out += [f"netns {d.netns}" for d in self.daemons if d.netns in names.split()]
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        out += [f"link {name}" for name in (f"{self.tag}a", f"{self.tag}b") if f" {name}@" in links or
                f" {name}:" in links]
        out += [f"dockerd {d.index}" for d in self.daemons if d.proc is not None and _alive(d.proc.pid)]
        return out
