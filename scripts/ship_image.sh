#!/usr/bin/env bash
# Copy a Docker image from this host's daemon to the daemons of other hosts, which cannot build it
# (a job's containers on other hosts, docker.hosts, run the launcher's image). One `docker save`
# is streamed into every `docker load` at once.
#
#   scripts/ship_image.sh IMAGE URL [URL...]
#   scripts/ship_image.sh omnilearn-worker:latest ssh://me@host2 ssh://me@host3
#
# A URL is any daemon address the docker CLI takes with -H (ssh://user@host, tcp://host:2376 with
# DOCKER_TLS_VERIFY and DOCKER_CERT_PATH set, unix:///path/to/docker.sock).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 IMAGE URL [URL...]" >&2
  exit 2
fi
image=$1
shift
docker image inspect "$image" >/dev/null || { echo "$0: no image $image on this host's daemon" >&2; exit 2; }
for url in "$@"; do
  docker -H "$url" version --format '{{.Server.Version}}' >/dev/null || {
    echo "$0: no Docker daemon answers at $url" >&2
    exit 2
  }
done
started=$SECONDS
# fifos, one per daemon: tee writes the one stream into all of them
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pids=()
fifos=()
i=0
for url in "$@"; do
  fifo="$work/load-$i"
  mkfifo "$fifo"
  docker -H "$url" load --quiet <"$fifo" &
  pids+=("$!")
  fifos+=("$fifo")
  i=$((i + 1))
done
docker save "$image" | tee "${fifos[@]}" >/dev/null
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=1
done
echo "shipped $image to $# daemon(s) in $((SECONDS - started)) s"
exit "$status"
