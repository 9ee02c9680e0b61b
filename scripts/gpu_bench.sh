#!/usr/bin/env bash
# The benchmark on a GPU machine that has PyTorch with CUDA but neither iproute2 nor our
# Python packages, and no network (the lent device machines: Ubuntu, Python 3.12, root).
#
#   scripts/gpu_bench.sh prepare          # here, on a Debian machine set up by scripts/setup.sh:
#                                         # .devicekit/ = this machine's ip, tc and nft with
#                                         # their libraries, and wheels of our dependencies
#   scripts/gpu_bench.sh run BENCH-ARGS   # there, from the repository root with .devicekit/:
#                                         # our wheels beside the machine's own torch,
#                                         # then python -m tensorlights.bench run BENCH-ARGS
#   scripts/gpu_bench.sh python ARGS      # there, the same set-up, then python3 ARGS
#                                         # (e.g. scripts/bench_agent.py on a GPU host's CPUs)
#   scripts/gpu_bench.sh bundle DIR       # there, after a run with --status-traces: DIR/status/
#                                         # (a file per host and run) into DIR/status.tar.gz,
#                                         # since the lent machine sends back at most 8 files;
#                                         # here `tar -xzf DIR/status.tar.gz -C DIR` restores it
#                                         # for `python -m tensorlights.bench traces DIR`
#
# .devicekit/ is ignored by git: name it in the device tool's `carry` for it to travel.
# The tools run from .devicekit/ through PATH and LD_LIBRARY_PATH; nothing is installed
# outside /tmp. Workers compute on the GPU with `--device cuda`.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=.devicekit

case "${1:-}" in
prepare)
    mkdir -p "$KIT/bin" "$KIT/lib" "$KIT/wheels"
    cp /usr/sbin/ip /usr/sbin/tc /usr/sbin/nft "$KIT/bin/"
    ldd /usr/sbin/ip /usr/sbin/tc /usr/sbin/nft | awk '/=>/ {print $3}' | sort -u |
        grep -v -E '/lib(c|m)\.so' | xargs -I{} cp -L {} "$KIT/lib/"
    .venv/bin/pip download -q --only-binary=:all: --python-version 3.12 \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_28_x86_64 --implementation cp --abi cp312 --abi abi3 \
        --abi none -d "$KIT/wheels" \
        "pyroute2==0.9.7" "grpcio==1.85.1" "protobuf>=7.35.1,<8" rich cryptography \
        "lightkube>=1.0,<2" psutil click prometheus-client
    du -sh "$KIT"
    ;;
run | python)
    mode=$1
    shift
    [[ -d $KIT/wheels ]] || { echo "no $KIT: run '$0 prepare' where iproute2 is" >&2; exit 2; }
    # Only the libraries the machine lacks: its own (newer) libz, libtinfo... stay in force
    # for Python and torch, which this path reaches too (the agent loads libnftables itself).
    missing=/tmp/tl-gpu-lib
    mkdir -p "$missing"
    for lib in "$KIT"/lib/*; do
        ldconfig -p | grep -q "^[[:space:]]*$(basename "$lib") " || ln -sf "$PWD/$lib" "$missing/"
    done
    # The machine's own Python, whose torch has CUDA (itself a venv there: a venv over it
    # would not see its packages); ours go to a folder ahead of its site-packages.
    site=/tmp/tl-gpu-site
    if [[ ! -d $site/pyroute2 ]]; then
        python3 -m pip install -q --no-index --find-links "$KIT/wheels" --target "$site" \
            "pyroute2==0.9.7" "grpcio==1.85.1" "protobuf>=7.35.1,<8" rich cryptography \
            "lightkube>=1.0,<2" psutil click prometheus-client
    fi
    export PATH="$PWD/$KIT/bin:$PATH" LD_LIBRARY_PATH="$missing" PYTHONPATH="$PWD:$site"
    if [[ $mode == python ]]; then
        exec python3 "$@"
    fi
    python3 -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"'
    exec python3 -m tensorlights.bench run --device cuda --no-plots "$@"
    ;;
bundle)
    dir=${2:?usage: $0 bundle DIR}
    [[ -d $dir/status ]] || { echo "no $dir/status: run the bench with --status-traces" >&2; exit 2; }
    tar -czf "$dir/status.tar.gz" -C "$dir" status
    rm -r "$dir/status"
    du -sh "$dir/status.tar.gz"
    ;;
*)
    echo "usage: $0 prepare | run BENCH-ARGS | python ARGS | bundle DIR" >&2
    exit 2
    ;;
esac
