#!/usr/bin/env bash
# Start an ASP job in Docker containers: aspworker1 is the parameter server, aspworker2..N+1 the
# workers (the paper's omnilearnASP.sh). Then run scripts/exec_HL.sh RUN_DIR on the host.
#
#   scripts/omnilearnASP.sh --out runs/asp1 [--hl HL8] [any `omnilearn cluster up` flag]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
omnilearn=${OMNILEARN:-$here/.venv/bin/omnilearn}
exec "$omnilearn" cluster up --mode asp --workers 4 \
  --set train.lr=0.1 --set train.momentum=0.9 --set train.weight_decay=0.0001 "$@"
