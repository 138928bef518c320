#!/usr/bin/env bash
# Make sure Slurm (slurmctld, slurmd, scontrol, squeue, sinfo), MUNGE and Slurm accounting
# (slurmdbd, sacctmgr, and a MariaDB server for it) are installed, so the sensor's integration
# tests can start their own private Slurm cluster in a temp dir (tests/support/slurm.py; with
# accounting, tests/support/slurm_accounting.py: QOS and association limits exist only with
# slurmdbd). Installs what is missing with apt-get when running as root; otherwise stops with
# the exact command to run. Does not start or configure any system-wide daemon: the tests run
# their own on free loopback ports. Idempotent and quick when already installed.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/usr/bin/$1" ]; }

# program -> Debian 12 package that ships it
declare -A package=(
  [slurmctld]=slurm-wlm [slurmd]=slurm-wlm [scontrol]=slurm-wlm [squeue]=slurm-wlm [sinfo]=slurm-wlm
  [munged]=munge
  [slurmdbd]=slurmdbd [sacctmgr]=slurm-wlm
  [mariadbd]=mariadb-server-core [mariadb-install-db]=mariadb-server-core [mariadb-admin]=mariadb-client
)
missing=()
packages=()
for exe in $(printf '%s\n' "${!package[@]}" | sort); do
  if ! have "$exe"; then
    missing+=("$exe")
    [[ " ${packages[*]} " == *" ${package[$exe]} "* ]] || packages+=("${package[$exe]}")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "epu: Slurm/MUNGE/accounting programs missing (${missing[*]}). Install them with:" >&2
  echo "    sudo apt-get update && sudo apt-get install -y ${packages[*]}" >&2
  exit 1
fi
# shellcheck source=scripts/apt-lock.sh
. "$(dirname "$0")/apt-lock.sh"
apt_lock
# another run may have installed them while this one waited for the lock
still_missing=()
for exe in "${missing[@]}"; do have "$exe" || still_missing+=("$exe"); done
[ ${#still_missing[@]} -eq 0 ] && exit 0
echo "epu: installing ${packages[*]} with apt-get (missing: ${missing[*]})" >&2
export DEBIAN_FRONTEND=noninteractive
"${APT_GET[@]}" update -qq
# policy-rc.d 101: the packages must not start system daemons; the tests start their own.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; created_policy=1; fi
trap '[ "$created_policy" -eq 1 ] && rm -f "$policy"' EXIT
"${APT_GET[@]}" install -y -qq "${packages[@]}" >/dev/null
for exe in "${missing[@]}"; do
  have "$exe" || { echo "epu: $exe still missing after installing ${package[$exe]}" >&2; exit 1; }
done
echo "epu: Slurm $(slurmctld -V 2>/dev/null || true) with accounting installed" >&2
