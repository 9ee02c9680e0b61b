#!/usr/bin/env bash
# Installs what TensorLights needs on a Debian machine (run as root): system packages and a
# virtualenv in .venv with the package. `scripts/setup.sh test` adds the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=${1:-}

packages=(iproute2 nftables ethtool python3 python3-venv python3-pip)
missing=()
for pkg in "${packages[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [[ $extra == test ]]; then
  # The tests start a real Slurm (munged, slurmctld, slurmd) as plain processes.
  test_packages=(slurmctld slurmd munge slurm-client)
  missing=()
  for pkg in "${test_packages[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    echo "installing for the tests: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
fi

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if [[ $extra == test ]]; then
  .venv/bin/python -m pip install -q -e '.[test]'
else
  .venv/bin/python -m pip install -q -e .
fi
