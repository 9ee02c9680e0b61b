#!/usr/bin/env bash
# The soak test (outside the default run): job churn on a PS host, the agent and the
# controller restarted; RSS, descriptors and tc/nft objects first vs last. As root.
#   SOAK_SECONDS=300 scripts/soak.sh      (at most 600)
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/pytest -q -s -p no:cacheprovider -m soak tests/soak "$@"
