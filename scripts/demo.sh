#!/usr/bin/env bash
# The main demo (README's first command). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m tensorlights.demo "$@"
