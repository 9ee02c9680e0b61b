#!/usr/bin/env bash
# Installs what TensorLights needs on a Debian machine (run as root): system packages and a
# virtualenv in .venv with the package. `scripts/setup.sh test` adds the test tools (and
# PyTorch for the real PS job's test), `scripts/setup.sh bench` the report's plotting,
# iperf3, PyTorch for the real-framework scenarios and TensorFlow in a virtualenv of its own
# (.venv-tf: 270 MB that nothing else needs; testbed/workloads.py runs the TF jobs with it).
set -euo pipefail
cd "$(dirname "$0")/.."
extra=${1:-}

install_missing() {  # apt-get install the given packages that are not installed yet
  local missing=()
  for pkg in "$@"; do
    # Installed, not merely known (a removed package keeps "deinstall ok config-files").
    [[ $(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null) == "install ok installed" ]] ||
      missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

install_missing iproute2 nftables ethtool python3 python3-venv python3-pip
if [[ $extra == test ]]; then
  # The tests start a real Slurm (munged, slurmctld, slurmd), a real Prometheus (and its
  # promtool) and a real etcd cluster (the controller replicas' election) as plain processes,
  # and build the Slurm plugin against Slurm's headers.
  install_missing slurmctld slurmd munge slurm-client prometheus etcd-server libslurm-dev \
    gcc make
elif [[ $extra == bench ]]; then
  install_missing iperf3  # scripts/bench_datapath_cost.py's line-rate traffic
fi

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if [[ $extra == test ]]; then
  # torch==2.13.0 is a local CPU wheel on our machines (anything looser pulls a CUDA build):
  # the real PyTorch PS job's test needs it.
  .venv/bin/python -m pip install -q -e ".[test,torch]"
elif [[ $extra == bench ]]; then
  .venv/bin/python -m pip install -q -e ".[bench,torch]"
  if [[ ! -x .venv-tf/bin/python ]]; then
    python3 -m venv .venv-tf
  fi
  .venv-tf/bin/python -m pip install -q tensorflow-cpu
else
  .venv/bin/python -m pip install -q -e .
fi
