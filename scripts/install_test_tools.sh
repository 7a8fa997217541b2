#!/usr/bin/env bash
# The system tools the test suite uses besides Python: shellcheck (the shell scripts' lint).
# Installed from Debian/Ubuntu packages when missing; `make test` runs this first.
set -euo pipefail

missing=()
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_test_tools.sh: missing ${missing[*]}; install it with your package manager" >&2
    exit 1
fi
as_root=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "install_test_tools.sh: missing ${missing[*]}; run as root" >&2; exit 1; }
    as_root=(sudo)
fi
if ! "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; then
    "${as_root[@]}" apt-get update -q
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
