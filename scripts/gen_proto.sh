#!/usr/bin/env bash
# Regenerates tensorlights/rpc/v1 from proto/ (messages, gRPC stubs and .pyi types). The output
# is committed; tests/unit/test_proto_generated.py fails when it differs from this script's.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.}
python=${PYTHON:-.venv/bin/python}
"$python" -m grpc_tools.protoc -I proto --python_out="$out" --grpc_python_out="$out" \
  --pyi_out="$out" proto/tensorlights/rpc/v1/*.proto
