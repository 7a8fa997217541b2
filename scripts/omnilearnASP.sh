#!/usr/bin/env bash
# Start an ASP job in Docker containers: aspworker1 is the parameter server, aspworker2..N+1 the
# workers (the paper's omnilearnASP.sh). Then run scripts/exec_HL.sh RUN_DIR on the host.
#
#   scripts/omnilearnASP.sh --out runs/asp1 [--config configs/asp-demo.yaml] [--hl HL8] [any `omnilearn cluster up` flag]
#
# Without --config the job starts from configs/asp-demo.yaml. Note that the paper's SGD momentum of
# 0.9 diverges with stale gradients applied one by one: the ASP configs use momentum 0.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
omnilearn=${OMNILEARN:-$here/.venv/bin/omnilearn}
exec "$omnilearn" cluster up --mode asp --workers 4 "$@"
