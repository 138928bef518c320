#!/usr/bin/env bash
# Make sure Slurm (slurmctld, slurmd, scontrol, squeue, sinfo) and MUNGE are installed, so the
# sensor's integration tests can start their own private Slurm cluster in a temp dir
# (tests/support/slurm.py). Installs them with apt-get when running as root; otherwise stops
# with the exact command to run. Does not start or configure any system-wide daemon: the
# tests run their own on free loopback ports. Idempotent and quick when already installed.
set -euo pipefail

missing=()
for exe in slurmctld slurmd scontrol squeue sinfo munged; do
  if ! command -v "$exe" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$exe" ]; then missing+=("$exe"); fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "epu: Slurm/MUNGE programs missing (${missing[*]}). Install them with:" >&2
  echo "    sudo apt-get update && sudo apt-get install -y slurm-wlm munge" >&2
  exit 1
fi
echo "epu: installing slurm-wlm and munge with apt-get (missing: ${missing[*]})" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# policy-rc.d 101: the packages must not start system daemons; the tests start their own.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; created_policy=1; fi
trap '[ "$created_policy" -eq 1 ] && rm -f "$policy"' EXIT
apt-get install -y -qq slurm-wlm munge >/dev/null
for exe in slurmctld slurmd scontrol munged; do
  command -v "$exe" >/dev/null 2>&1 || [ -x "/usr/sbin/$exe" ] || { echo "epu: $exe still missing after install" >&2; exit 1; }
done
echo "epu: Slurm $(slurmctld -V 2>/dev/null || true) installed" >&2
