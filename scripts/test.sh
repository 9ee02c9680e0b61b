#!/usr/bin/env bash
# Installs everything the tests need and runs lint, types and the whole suite (README's second
# command; .ci/run calls it). Needs root: functional tests build network namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
.venv/bin/ruff check tensorlights tests scripts
.venv/bin/ruff format --check tensorlights tests scripts
.venv/bin/mypy
exec .venv/bin/pytest -q -p no:cacheprovider "$@"
