"""The container launcher: one Docker container per rank on an attachable Swarm overlay network.

``up`` joins or initialises Swarm, creates the job's overlay network and starts the containers
(``worker1``..``workerN`` for BSP; ``aspworker1`` = parameter server, ``aspworker2``.. for ASP), each
with the first level's allocation, labels naming the job, and only the files of the run folder its rank
needs (:mod:`.mounts`). Every container runs confined (:func:`confinement`): an unprivileged user, no
capabilities, no privilege gain, a pids limit, a read-only root file system. A container runs the worker
entry point directly, so its life is the worker's life. ``down`` removes everything the job made, found
by label, so it also works after a crash. All through the Docker SDK.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from omnilearn.config import DockerConfig
from omnilearn.emulator.backends.docker import (
    LABEL_JOB,
    LABEL_RANK,
    LABEL_TARGET,
    DockerBackend,
    docker_sdk,
    run_kwargs,
)
from omnilearn.emulator.backends.dockerd import answering, daemon_client, image_or_none
from omnilearn.emulator.network.docker_net import ContainerLinks
from omnilearn.emulator.protocol.toggler import Toggler
from omnilearn.emulator.protocol.toggler_host import TogglerHost
from omnilearn.errors import UserError
from omnilearn.files import write_atomic
from omnilearn.images.requirements import with_requirements
from omnilearn.images.worker import ensure_images
from omnilearn.jobfile import JOB_FILE, JobSpec
from omnilearn.launch.docker.containers import container_states, save_logs, tail_logs
from omnilearn.launch.docker.daemon import clients_for
from omnilearn.launch.docker.faults import (
    DaemonLost,
    DaemonWatch,
    daemon_address,
    daemon_errors,
    daemon_lost,
    stop_gracefully,
    vanished,
)
from omnilearn.launch.docker.mounts import (
    DATA_MOUNT,
    RUN_MOUNT,
    container_mounts,
    container_user,
    prepare_run_folder,
    remote_mounts,
    workload_env,
)
from omnilearn.launch.docker.reaper import Reaper
from omnilearn.launch.docker.remote import RemoteRunFolders, make_volume, remote_containers, run_remote
from omnilearn.launch.failures import WorkerFailed
from omnilearn.launch.interrupts import Interrupts
from omnilearn.launch.pidfile import JobRecord
from omnilearn.launch.supervise import States, supervise
from omnilearn.observe.progress import progress_for
from omnilearn.train.lifecycle import STOPPED_STATUS

log = logging.getLogger("omnilearn.swarm")

STATE_FILE = "cluster.json"
TMPFS = {"/tmp": "rw,nosuid,nodev,size=1g,mode=1777"}
"""The only writable place of a container's own file system (its root is read-only)."""
TMP_ENV = {"HOME": "/tmp", "XDG_CACHE_HOME": "/tmp/.cache", "MPLCONFIGDIR": "/tmp/matplotlib",
           "TORCH_HOME": "/tmp/torch", "PYTHONDONTWRITEBYTECODE": "1"}
"""Caches (torch, matplotlib, anything that honours HOME) go to the tmpfs."""


@dataclass
class ClusterState:
    """What ``up`` made, written to ``OUT/cluster.json`` so ``status``/``down`` find it again."""

    job_id: str
    network: str
    subnet: str | None
    containers: dict[str, str] = field(default_factory=dict)  # target -> container id
    hosts: dict[str, str] = field(default_factory=dict)  # target -> daemon URL (absent: local)
    swarm_initialized: bool = False

    def save(self, out_dir: Path) -> None:
        write_atomic(out_dir / STATE_FILE, json.dumps(self.__dict__, indent=2))

    @staticmethod
    def load(out_dir: Path) -> ClusterState:
        path = out_dir / STATE_FILE
        if not path.is_file():
            raise UserError(f"{out_dir}: no {STATE_FILE} (was `omnilearn cluster up` run with this --out?)")
        return ClusterState(**json.loads(path.read_text()))


def ensure_swarm(client: Any, advertise_addr: str | None) -> bool:
    """Make this daemon a Swarm manager if it is in no swarm; returns True when it initialised one."""
    info = client.info().get("Swarm", {})
    if info.get("LocalNodeState") == "active":
        if not info.get("ControlAvailable"):
            log.info("this host is a Swarm worker: the overlay network must exist on the manager")
        return False
    dk = docker_sdk()
    try:
        client.swarm.init(advertise_addr=advertise_addr)
    except dk.errors.APIError as e:
        if advertise_addr is None and "advertise" in str(e).lower():
            client.swarm.init(advertise_addr="127.0.0.1")  # a host with no routable address (CI, laptops)
        else:
            raise UserError(f"docker swarm init failed: {e.explanation or e}") from e
    return True


def _check_names_free(job: JobSpec, default: Any, remote: dict[str, Any]) -> None:
    dk = docker_sdk()
    for target in (job.plan.targets[s] for s in job.slots):
        client = remote.get(target, default)
        try:
            c = client.containers.get(target)
        except dk.errors.NotFound:
            continue
        owner = (c.labels or {}).get(LABEL_JOB)
        raise UserError(f"a container named {target} already exists ({'job ' + owner if owner else 'not omnilearn'}"
                        f", {c.status}): remove it first" + (f" with `omnilearn cluster down --job {owner}`"
                                                             if owner else ""))


def confinement(docker: DockerConfig, user: tuple[int, int]) -> dict[str, Any]:
    """``containers.run`` arguments that take from a worker everything training does not need (README,
    "Security model", says what each one protects against)."""
    return {"user": f"{user[0]}:{user[1]}", "cap_drop": ["ALL"], "security_opt": ["no-new-privileges"],
            "pids_limit": docker.pids_limit, "read_only": True, "tmpfs": dict(TMPFS)}


def overlay_encrypted(docker: DockerConfig) -> bool:
    """``docker.encrypted``; unset: on when a target runs on another daemon (traffic leaves this host)."""
    return docker.encrypted if docker.encrypted is not None else bool(docker.hosts)


def network_name(job: JobSpec) -> str:
    """The job's overlay network: ``docker.network``, else ``omnilearn-<job id>``."""
    return job.config.docker.network or f"omnilearn-{job.job_id}"


def link_applier(job: JobSpec, backend: DockerBackend) -> ContainerLinks | None:
    """The shaper of the containers' links when the job has links (shaped from this host)."""
    return ContainerLinks(backend, network_name(job)) if job.plan.links else None


def _data_root(job: JobSpec) -> Path | None:
    root = Path(job.config.data.root).resolve()
    return root if root.is_dir() else None


def up(job: JobSpec, console: Console | None = None) -> ClusterState:
    """Start the job's containers (the job file must already be saved in ``job.out_dir``)."""
    cfg = job.config
    dk = docker_sdk()
    default, remote = clients_for(job)
    if cfg.docker.build:
        images = ensure_images(cfg.docker.image, client=default, on_log=log.debug)
        if console:
            b = images.worker_build
            console.print(f"image {cfg.docker.image}: " + (images.reason if b is None else
                          f"built in {b.seconds:.0f} s ({b.size_bytes / 1e9:.2f} GB; {images.reason})"), markup=False)
    image = with_requirements(default, cfg.docker.image, cfg.docker.requirements, on_log=log.debug)
    local_image = image_or_none(default, image)
    for target, client in remote.items():  # the same image (by id), or workers would run other code
        there = image_or_none(client, image)
        if there is None or (local_image is not None and there.id != local_image.id):
            raise UserError(f"docker.hosts.{target}: image {image} is {'not' if there is None else 'another'} "
                            f"on the daemon at {cfg.docker.hosts[target]}"
                            f"{'' if there is None else ' than on this one'}: copy it with "
                            f"scripts/ship_image.sh {image} {cfg.docker.hosts[target]}")
    initialized = ensure_swarm(default, cfg.docker.advertise_addr)
    _check_names_free(job, default, remote)
    net_name = network_name(job)
    labels = {LABEL_JOB: job.job_id}
    taken = {n.name for n in default.networks.list(filters={"label": f"{LABEL_JOB}={job.job_id}"})}
    if net_name in taken:  # an earlier attempt's, still held by the tasks of a host that went away
        net_name = next(f"{net_name}-{i}" for i in range(2, len(taken) + 3) if f"{net_name}-{i}" not in taken)
    state = ClusterState(job_id=job.job_id, network=net_name, subnet=None, hosts=dict(cfg.docker.hosts),
                         swarm_initialized=initialized)
    state.save(job.out_dir)  # before anything is made: `down` can always find the job
    options = {"encrypted": "true"} if overlay_encrypted(cfg.docker) else None
    try:
        network = default.networks.create(net_name, driver="overlay", attachable=True, labels=labels,
                                          options=options, check_duplicate=True)
    except dk.errors.APIError as e:
        raise UserError(f"cannot create overlay network {net_name}: {e.explanation or e}") from e
    network.reload()
    ipam = (network.attrs.get("IPAM") or {}).get("Config") or [{}]
    state.subnet = ipam[0].get("Subnet")
    user = container_user()
    prepare_run_folder(job, user)
    data_root = _data_root(job)
    command = ["omnilearn", "worker", "--job", f"{RUN_MOUNT}/{JOB_FILE}", "--out-dir", RUN_MOUNT]
    if data_root:
        command += ["--data-root", DATA_MOUNT]
    slots = job.slots  # survivors are re-ranked; their containers keep their names, files and allocations
    world = len(slots)
    first, period = job.plan.first_level(), cfg.emulation.cpu_period_us
    for rank, slot in enumerate(slots):
        target = job.plan.targets[slot]
        env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": job.plan.targets[slots[0]], "MASTER_PORT": str(cfg.docker.master_port),
               "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", **TMP_ENV, **workload_env(job)}
        if state.subnet:
            env["OMNILEARN_SUBNET"] = state.subnet  # the worker finds its overlay interface for gloo
        run_args = dict(image=image, command=command, name=target, hostname=target, detach=True, init=True,
                        network=net_name, environment=env, working_dir=RUN_MOUNT,
                        labels={**labels, LABEL_TARGET: target, LABEL_RANK: str(rank)},
                        **confinement(cfg.docker, user), **run_kwargs(job.plan.allocation(first, target), period))
        if target in remote:  # no bind mount of this host's files: a volume on its own daemon, synced
            mounts = remote_mounts(job, make_volume(remote[target], job.job_id, target), data_root)
            container = run_remote(remote[target], job, slot, user, RUN_MOUNT, mounts, **run_args)
        else:
            container = default.containers.run(mounts=container_mounts(job, slot, data_root), **run_args)
        state.containers[target] = container.id
        state.save(job.out_dir)
    if console:
        console.print(f"cluster up: {world} containers on overlay network {net_name} ({state.subnet}), "
                      f"level {first}", markup=False)
    return state


def _job_containers(client: Any, job_id: str) -> list[Any]:
    return client.containers.list(all=True, filters={"label": f"{LABEL_JOB}={job_id}"})


def status(out_dir: Path) -> list[dict[str, Any]]:
    """One row per container of the job: state, exit code, CPU limits as the daemon has them."""
    job = JobSpec.load(out_dir / JOB_FILE, out_dir=out_dir)
    default, remote = clients_for(job)
    rows = []
    for target in job.plan.targets:
        client = remote.get(target, default)
        found = [c for c in _job_containers(client, job.job_id) if c.name == target]
        if not found:
            rows.append({"target": target, "status": "absent"})
            continue
        c = found[0]
        hc = c.attrs.get("HostConfig", {})
        rows.append({"target": target, "status": c.status, "exit_code": c.attrs["State"].get("ExitCode"),
                     "cpus": (hc.get("CpuQuota") or 0) / (hc.get("CpuPeriod") or 100_000) or None,
                     "cpuset": hc.get("CpusetCpus") or None, "id": c.short_id})
    return rows


def down(job_id: str, hosts: dict[str, str] | None = None, leave_swarm: bool = False,
         timeout: float = 10.0) -> list[str]:
    """Remove every container and network labelled with ``job_id``; returns what was removed. Another
    host's daemon that does not answer is passed over (what the job has there waits for ``omnilearn
    cleanup``), then named in a UserError once everything else is removed."""
    dk = docker_sdk()
    default = daemon_client()
    clients, silent = [default], []
    for url in sorted(set((hosts or {}).values())):
        try:
            clients.append(answering(url))
        except Exception:  # noqa: BLE001 - whatever stops it answering, it is passed over
            silent.append(url)
    removed: list[str] = []
    for client in clients:
        for c in _job_containers(client, job_id):
            with contextlib.suppress(dk.errors.NotFound):
                c.remove(force=True)
                removed.append(f"container {c.name}")
        for volume in client.volumes.list(filters={"label": f"{LABEL_JOB}={job_id}"}):  # run folders elsewhere
            with contextlib.suppress(dk.errors.NotFound):
                volume.remove(force=True)
                removed.append(f"volume {volume.name}")
    for net in default.networks.list(filters={"label": f"{LABEL_JOB}={job_id}"}):
        for attempt in range(40):  # a just-removed container (another host's: its attachment task) holds it briefly
            try:
                net.remove()
                removed.append(f"network {net.name}")
                break
            except dk.errors.NotFound:
                break
            except dk.errors.APIError:
                if silent:  # its tasks hold the network until that host is back: cleanup's work, said below
                    break
                if attempt == 39:
                    raise
                time.sleep(0.5)
    if leave_swarm and not default.networks.list(filters={"label": LABEL_JOB}):
        with contextlib.suppress(dk.errors.APIError):
            default.swarm.leave(force=True)
            removed.append("swarm membership")
    if silent:
        raise UserError(f"job {job_id}: removed {', '.join(removed) or 'nothing'}; the Docker daemon at "
                        f"{', '.join(silent)} does not answer: run `omnilearn cleanup` once it is back")
    return removed


def _exit_status(state: str, code: int | None) -> int | None:
    """A container's exit status for :func:`~omnilearn.launch.supervise.supervise`: None while it runs; one
    that vanished or died without a status failed (-1)."""
    if state not in ("exited", "dead", "vanished"):
        return None
    return code if code is not None else -1


def container_failure(job: JobSpec, state: ClusterState, default: Any, remote: dict[str, Any], watch: DaemonWatch,
                      states: dict[str, tuple[str, int | None, float]], slot: int, code: int) -> Exception:
    """What the first failed container is told as: its daemon stopping (raised by ``watch``), a container
    that vanished, a user error the worker found (exit status 2), else its exit and last log lines.
    ``states``: the containers' as the supervise loop last saw them."""
    target = job.plan.targets[slot]
    client = remote.get(target, default)
    # A daemon going down stops the containers first: is it the cause?
    watch.check_daemon(client, stopped=code in (STOPPED_STATUS, 128 + signal.SIGTERM))
    gone = [t for t, (s, _, _) in states.items() if s == "vanished"]  # the cause, not its peers'
    if gone:
        return vanished(gone[0], job.plan.targets.index(gone[0]))
    if code == UserError.exit_status:  # a user error found by the worker
        logs = tail_logs(client, state.containers[target], 40)
        errors = [ln for ln in logs.splitlines() if ln.startswith("omnilearn: error: ")]
        return UserError(f"container {target}: " + (errors[-1].removeprefix("omnilearn: error: ") if errors
                                                     else "exited with status 2"))
    status = states.get(target, ("exited", code, 0.0))[0]
    return WorkerFailed(f"container {target} (rank {slot}) ended: {status}, exit code {code}; last lines:\n"
                        f"{tail_logs(client, state.containers[target])}", slot=slot)


def run_docker(job: JobSpec, console: Console, label: str, show_progress: bool = True) -> None:
    """``omnilearn run --backend docker``: up, toggler, wait, and always down."""
    job.backend = "docker"
    job.save()
    record = JobRecord(job.job_id, job.out_dir, "docker", job.config.docker.hosts)  # for `omnilearn cleanup`
    default, remote = clients_for(job)
    backend = DockerBackend(job.job_id, default, clients=remote, period_us=job.config.emulation.cpu_period_us)
    links = link_applier(job, backend)
    toggler = TogglerHost(lambda: Toggler(job.log_dir, backend, job.plan, links=links), job.log_dir)
    state: ClusterState | None = None
    watch: DaemonWatch | None = None
    daemon_gone = False
    reaper = Reaper(job.job_id, job.config.docker.hosts, job.config.docker.stop_timeout, job.log_dir / "reaper.log")
    sync: RemoteRunFolders | None = None

    def blame(error: BaseException, client: Any) -> DaemonLost:
        """A lost daemon named: the launcher's, or another host's with the workers it ran (they cannot come back)."""
        if client is default:
            return daemon_lost(error, job.out_dir)
        ran = [t for t in (state.containers if state else remote) if remote.get(t) is client]
        url = job.config.docker.hosts[ran[0]] if ran else None
        return daemon_lost(error, job.out_dir, url, ran, [job.plan.targets.index(t) for t in ran])

    try:
        with toggler:
            state = up(job, console)  # Ctrl-C here interrupts the image build or the SDK call at once
            watch = DaemonWatch([default, *{id(c): c for c in remote.values()}.values()], job.job_id, job.out_dir,
                                blame)
            if remote:  # the run folders of the containers on other daemons, kept in step
                sync = RemoteRunFolders(job, remote_containers(job, state.containers, remote), RUN_MOUNT)
                sync.start()
            running, seen = state, {}  # the containers' states as the last round saw them

            def states() -> States:
                watch.check()
                try:
                    found = container_states(default, remote, running.containers)
                except daemon_errors() as e:
                    for client in [default, *remote.values()]:  # which one stopped answering
                        watch.check_daemon(client, stopped=False)
                    raise daemon_lost(e, job.out_dir) from None
                seen.clear()
                seen.update(found)
                return {job.plan.targets.index(t): (_exit_status(s, code), when) for t, (s, code, when) in found.items()}

            def failure(slot: int, code: int) -> Exception:
                return container_failure(job, running, default, remote, watch, seen, slot, code)

            with Interrupts() as interrupts, (progress_for(job, label, console)
                                              if show_progress else contextlib.nullcontext()) as progress:
                if progress:
                    progress.set_epochs(job.config.train.epochs)
                supervise(states, failure, interrupts, progress, interval=1.0)
    except DaemonLost:
        daemon_gone = True  # the message says what to do; no second one from the teardown
        raise
    finally:
        toggler.stop()
        if watch is not None:
            watch.close()
        try:
            backend.close()  # a container still paused by a stall is let go before it is removed
            if links is not None:
                links.close()
            take_down(job, state, default, remote, sync)
            record.close()
        except (UserError, *daemon_errors()) as e:  # a daemon is gone, or a lost host's tasks hold the network:
            # the job's record stays for cleanup
            (log.info if daemon_gone else log.warning)(
                "cannot remove all of the job's containers and networks yet (%s): run `omnilearn cleanup` once "
                "every daemon answers (the launcher's: %s)", e, daemon_address())
        finally:
            reaper.release()


def take_down(job: JobSpec, state: ClusterState | None, default: Any, remote: dict[str, Any],
              sync: RemoteRunFolders | None) -> None:
    """The job's containers stopped (SIGTERM first: workers end at a step boundary and save), their output
    and remote run folders brought home, then containers and network removed."""
    if state is not None:
        stop_gracefully({t: (remote.get(t, default), cid) for t, cid in state.containers.items()},
                        job.config.docker.stop_timeout)
        if sync is not None:
            sync.finish()
        save_logs(default, remote, state.containers, job.log_dir, list(job.plan.targets))
    removed = down(job.job_id, job.config.docker.hosts, leave_swarm=bool(state and state.swarm_initialized))
    log.info("cluster down: %s", ", ".join(removed))
