#!/usr/bin/env bash
# Start a BSP job in Docker containers worker1..workerN (the paper's omnilearnBSP.sh), then run
# scripts/exec_HL.sh RUN_DIR on the host to apply the heterogeneity levels while it trains.
#
#   scripts/omnilearnBSP.sh --out runs/bsp1 [--config configs/resnet18.yaml] [--hl HL8] [any `omnilearn cluster up` flag]
#   scripts/exec_HL.sh runs/bsp1          # the toggler; returns when the job's containers have exited
#   .venv/bin/omnilearn cluster down --out runs/bsp1
#
# For everything in one command: omnilearn run --backend docker ...
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
omnilearn=${OMNILEARN:-$here/.venv/bin/omnilearn}
# The paper's BSP parameters (lr 0.1, momentum 0.9, weight decay 1e-4, 4 workers); flags after these win.
exec "$omnilearn" cluster up --mode bsp --workers 4 \
  --set train.lr=0.1 --set train.momentum=0.9 --set train.weight_decay=0.0001 "$@"
