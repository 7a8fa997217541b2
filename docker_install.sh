#!/usr/bin/env bash
# Install and start Docker Engine on Debian/Ubuntu, for omnilearn's container emulator.
#
#   ./docker_install.sh              distribution packages (docker.io): reachable wherever apt is
#   ./docker_install.sh --upstream   Docker's own apt repository (download.docker.com): newer Engine
#   ./docker_install.sh --swarm      also make this host a single-node swarm (omnilearn's launcher needs one)
#
# Idempotent: packages already installed are not touched and a daemon that already answers is left
# alone, so a second run only checks and exits 0 in a second or two. Runs as root or through sudo.
# Without systemd (containers, CI sandboxes) dockerd is started detached, logging to /var/log/dockerd.log.
set -euo pipefail

readonly SOCKET="unix:///var/run/docker.sock"
readonly LOG=/var/log/dockerd.log
readonly UPSTREAM_URL="https://download.docker.com/linux"

upstream=0
swarm=0
timeout=60

usage() {
    cat <<'EOF'
usage: docker_install.sh [--upstream] [--swarm] [--timeout SECONDS]

  --upstream         install docker-ce from Docker's apt repository instead of the distribution's docker.io
  --swarm            after start, run 'docker swarm init --advertise-addr 127.0.0.1' unless already in a swarm
  --timeout SECONDS  how long to wait for the daemon to answer (default 60)
EOF
}

die() {
    echo "docker_install.sh: error: $*" >&2
    exit 1
}

say() {
    echo "docker_install.sh: $*"
}

while (($#)); do
    case "$1" in
    --upstream) upstream=1 ;;
    --swarm) swarm=1 ;;
    --timeout)
        [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || die "--timeout needs a whole number of seconds"
        timeout="$2"
        shift
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    *)
        usage >&2
        die "unknown option: $1"
        ;;
    esac
    shift
done

# Root runs commands directly; anyone else goes through sudo (its password asked once, up front).
as_root=()
if [[ $EUID -ne 0 ]]; then
    command -v sudo >/dev/null || die "not root and sudo is not installed: run this script as root"
    as_root=(sudo)
    sudo -v || die "sudo failed: run this script as root"  # ask now, not from the background start below
fi

# Always ask the local daemon, whatever DOCKER_HOST or the docker context says: that is the one we start.
daemon_answers() {
    "${as_root[@]}" docker -H "$SOCKET" info >/dev/null 2>&1
}

# procps (pgrep) is not on minimal systems: look at /proc directly.
dockerd_running() {
    local f comm
    for f in /proc/[0-9]*/comm; do
        comm="$(cat "$f" 2>/dev/null || true)"
        [[ $comm == dockerd ]] && return 0
    done
    return 1
}

is_installed() {
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

# ---------------------------------------------------------------------------------------------- checks
[[ -r /etc/os-release ]] || die "/etc/os-release missing: this script knows Debian and Ubuntu only"
# shellcheck source=/dev/null
. /etc/os-release
case " ${ID:-} ${ID_LIKE:-} " in
*" debian "* | *" ubuntu "*) ;;
*) die "unsupported distribution '${ID:-unknown}': this script knows Debian and Ubuntu only" ;;
esac
command -v apt-get >/dev/null || die "apt-get not found"

# ------------------------------------------------------------------------------------------- packages
# iptables: dockerd programs NAT/filter rules for bridge and overlay networks and will not start without it.
# debootstrap: omnilearn builds its base image locally when no registry is reachable (omnilearn image build).
# ca-certificates, curl, gnupg: only for --upstream (repository key over HTTPS).
if ((upstream)); then
    packages=(docker-ce docker-ce-cli containerd.io docker-buildx-plugin iptables debootstrap)
    for conflicting in docker.io podman-docker; do
        if is_installed "$conflicting"; then
            die "--upstream: the distribution package '$conflicting' is installed and conflicts with docker-ce;" \
                "remove it first (apt-get remove $conflicting containerd runc) or run without --upstream"
        fi
    done
else
    packages=(docker.io iptables debootstrap)
fi

missing=()
for p in "${packages[@]}"; do
    is_installed "$p" || missing+=("$p")
done

apt_install() {
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
}

add_upstream_repository() {
    local keyring=/etc/apt/keyrings/docker.asc
    local list=/etc/apt/sources.list.d/docker.list
    local arch
    arch="$(dpkg --print-architecture)"
    if [[ ! -s $keyring ]]; then
        local prereq=()
        for p in ca-certificates curl; do is_installed "$p" || prereq+=("$p"); done
        if ((${#prereq[@]})); then
            "${as_root[@]}" apt-get update -q
            apt_install "${prereq[@]}"
        fi
        local tmp
        tmp="$(mktemp)"
        # shellcheck disable=SC2064  # expand now: the trap must remove this very file
        trap "rm -f '$tmp'" EXIT
        if ! curl -fsSL --max-time 30 "$UPSTREAM_URL/$ID/gpg" -o "$tmp"; then
            die "--upstream: cannot download Docker's repository key from $UPSTREAM_URL/$ID/gpg" \
                "(no network route to download.docker.com?). Run without --upstream to use the" \
                "distribution's docker.io package instead."
        fi
        "${as_root[@]}" install -d -m 0755 /etc/apt/keyrings
        "${as_root[@]}" install -m 0644 "$tmp" "$keyring"
    fi
    local line="deb [arch=$arch signed-by=$keyring] $UPSTREAM_URL/$ID ${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release} stable"
    if [[ "$(cat "$list" 2>/dev/null || true)" != "$line" ]]; then
        echo "$line" | "${as_root[@]}" tee "$list" >/dev/null
    fi
}

if ((${#missing[@]})); then
    start_install=$SECONDS
    if ((upstream)); then
        add_upstream_repository
    fi
    say "installing ${missing[*]}"
    if ! "${as_root[@]}" apt-get update -q; then
        if ((upstream)); then
            die "--upstream: apt-get update failed (is download.docker.com reachable?). Remove" \
                "/etc/apt/sources.list.d/docker.list and run without --upstream to use docker.io instead."
        fi
        die "apt-get update failed"
    fi
    if ! apt_install "${missing[@]}"; then
        if ((upstream)); then
            die "--upstream: could not install ${missing[*]} from $UPSTREAM_URL (unreachable?)." \
                "Run without --upstream to use the distribution's docker.io package instead."
        fi
        die "apt-get install ${missing[*]} failed"
    fi
    say "packages installed in $((SECONDS - start_install)) s"
else
    say "packages already installed: ${packages[*]}"
fi

command -v dockerd >/dev/null || die "dockerd not found after installation"
command -v docker >/dev/null || die "docker CLI not found after installation"

# ------------------------------------------------------------------------------------------ daemon
start_daemon() {
    if [[ -d /run/systemd/system ]]; then
        # systemd is PID 1: let it own the daemon (restarts, boot-time start).
        say "starting docker with systemd"
        "${as_root[@]}" systemctl enable --now docker.service ||
            die "systemctl could not start docker.service; see: journalctl -u docker.service"
        return
    fi
    if dockerd_running; then
        say "dockerd is already running but not answering yet: waiting for it"
        return
    fi
    say "no systemd: starting dockerd in the background (log: $LOG)"
    # setsid + nohup: the daemon gets its own session, so it outlives this shell and the caller's terminal.
    # The log path goes in as an argument, never spliced into the command text.
    # shellcheck disable=SC2016  # $1 is expanded by the inner bash, on purpose
    "${as_root[@]}" setsid nohup bash -c 'exec dockerd >>"$1" 2>&1 </dev/null' dockerd-launcher "$LOG" \
        </dev/null >/dev/null 2>&1 &
    disown || true
}

if daemon_answers; then
    say "the Docker daemon already answers at $SOCKET"
else
    start_daemon
    started=$SECONDS
    deadline=$((SECONDS + timeout))
    until daemon_answers; do
        # Without systemd nobody restarts a dockerd that died: stop waiting as soon as it is gone.
        exited=0
        if [[ ! -d /run/systemd/system ]] && ((SECONDS - started >= 2)) && ! dockerd_running; then
            exited=1
        fi
        if ((exited || SECONDS >= deadline)); then
            if ((exited)); then
                echo "docker_install.sh: error: dockerd exited without answering at $SOCKET." >&2
            else
                echo "docker_install.sh: error: the Docker daemon did not answer at $SOCKET within ${timeout} s." >&2
            fi
            if [[ -d /run/systemd/system ]]; then
                echo "  see: journalctl -u docker.service" >&2
            elif [[ -r $LOG ]]; then
                reason="$(grep -a 'failed to start daemon' "$LOG" | tail -n 1 || true)"
                [[ -z $reason ]] || echo "  reason: $reason" >&2
                echo "  last lines of $LOG:" >&2
                tail -n 15 "$LOG" | sed 's/^/    /' >&2
            fi
            exit 1
        fi
        sleep 1
    done
    say "the Docker daemon answers (after $((SECONDS - started)) s)"
fi

if ((swarm)); then
    state="$("${as_root[@]}" docker -H "$SOCKET" info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null || true)"
    if [[ $state == active ]]; then
        say "this host is already in a swarm"
    else
        say "initialising a single-node swarm"
        "${as_root[@]}" docker -H "$SOCKET" swarm init --advertise-addr 127.0.0.1 >/dev/null ||
            die "docker swarm init failed"
    fi
fi

version="$("${as_root[@]}" docker -H "$SOCKET" version --format '{{.Server.Version}}' 2>/dev/null || echo '?')"
say "ready: Docker Engine $version"
if [[ $EUID -ne 0 ]] && ! id -nG | tr ' ' '\n' | grep -qx docker; then
    say "note: to use docker without sudo: sudo usermod -aG docker $(id -un), then log in again"
fi
