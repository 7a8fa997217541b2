#!/usr/bin/env bash
# Join other hosts' Docker daemons to this host's swarm as workers, so a job's containers on them
# share the job's overlay network (docker.hosts in the job's config places a target on a host).
# Run it on the launcher's host; it makes this host a swarm manager when it is in no swarm yet.
#
#   scripts/swarm_join.sh --advertise-addr ADDR URL=ADDR [URL=ADDR...]
#   scripts/swarm_join.sh --advertise-addr 10.0.0.1 ssh://me@host2=10.0.0.2 ssh://me@host3=10.0.0.3
#
# ADDR: each host's own address on the network the hosts share; the hosts must reach each other
# on TCP 2377 (to the manager), TCP and UDP 7946 and UDP 4789 (overlay traffic), and ESP (IP
# protocol 50) when the overlay is encrypted, omnilearn's default across hosts.
# --manager URL: the manager's daemon when it is not this host's (default: the local daemon).
set -euo pipefail
usage() {
  echo "usage: $0 [--manager URL] --advertise-addr ADDR URL=ADDR [URL=ADDR...]" >&2
  exit 2
}
manager=()
addr=
while [ $# -gt 0 ]; do
  case "$1" in
  --manager)
    [ $# -ge 2 ] || usage
    manager=(-H "$2")
    shift 2
    ;;
  --advertise-addr)
    [ $# -ge 2 ] || usage
    addr=$2
    shift 2
    ;;
  -h | --help) usage ;;
  *) break ;;
  esac
done
if [ -z "$addr" ] || [ $# -lt 1 ]; then usage; fi
state=$(docker "${manager[@]}" info --format '{{.Swarm.LocalNodeState}}')
if [ "$state" != active ]; then
  docker "${manager[@]}" swarm init --advertise-addr "$addr" >/dev/null
  echo "this host ($addr) is now a swarm manager"
fi
token=$(docker "${manager[@]}" swarm join-token --quiet worker)
for pair in "$@"; do
  url=${pair%=*}
  host_addr=${pair##*=}
  if [ "$url" = "$pair" ] || [ -z "$host_addr" ]; then
    echo "$0: $pair: expected URL=ADDR" >&2
    exit 2
  fi
  if [ "$(docker -H "$url" info --format '{{.Swarm.LocalNodeState}}')" = active ]; then
    echo "$url: already in a swarm (leave it first with: docker -H $url swarm leave)"
    continue
  fi
  docker -H "$url" swarm join --token "$token" --advertise-addr "$host_addr" "$addr:2377"
done
docker "${manager[@]}" node ls
