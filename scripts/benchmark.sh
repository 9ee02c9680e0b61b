#!/usr/bin/env bash
# The benchmark (issue 8): every scenario under every policy, 3 repetitions, the report under
# results/bench-<date>/ (report.md, PNGs, trials.jsonl). Needs root; ~30 min on 2 cores.
#   scripts/benchmark.sh [--scenarios a,b] [--policies fifo,rotate] [--reps N] [--out DIR] ...
# An interrupted run resumes when given the same --out.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh bench
out=results/bench-$(date +%Y%m%d)
for arg in "$@"; do [[ $arg == --out* ]] && out=; done
exec .venv/bin/python -m tensorlights.bench run ${out:+--out "$out"} "$@"
