#!/usr/bin/env bash
# The host-side toggler of the paper (exec_HL.sh): reads the workers' CPU requests from
# RUN_DIR/logs/cpu-<rank>.log and applies each with a container update (docker update), recording
# every change in RUN_DIR/logs/toggler-audit.jsonl. Returns when all the job's containers have exited.
#
#   scripts/exec_HL.sh RUN_DIR [--interval SECONDS]
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 RUN_DIR [--interval SECONDS]" >&2
  exit 2
fi
run_dir=$1
shift
here=$(cd "$(dirname "$0")/.." && pwd)
omnilearn=${OMNILEARN:-$here/.venv/bin/omnilearn}
exec "$omnilearn" toggle --out "$run_dir" --until-done "$@"
