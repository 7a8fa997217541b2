#!/usr/bin/env bash
# Stage the Markdown for mkdocs (mkdocs.yml) and run it: `scripts/docs_site.sh build` or `serve`.
# README.md becomes the home page; docs/, results/ and the files they link keep the repository's
# layout, so the same relative links work in the site, on GitHub and in an editor.
set -euo pipefail
cd "$(dirname "$0")/.."
MKDOCS="${MKDOCS:-.venv/bin/mkdocs}"
src=build/site-src
rm -rf "$src"
mkdir -p "$src/configs/traces"
cp README.md "$src/index.md"
cp -r docs results figures "$src/"
rm -f "$src/docs/requirements.txt"
cp cpus_allocation.md "$src/"
cp configs/traces/README.md "$src/configs/traces/"
# README.md links the home page's neighbours as docs/...; inside the site they are the same paths.
exec "$MKDOCS" "${1:-build}"
