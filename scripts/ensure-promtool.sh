#!/usr/bin/env bash
# Make sure `promtool` (Debian package `prometheus`) is installed, so `make test` validates and
# unit-tests the shipped alert rules (deploy/prometheus/, tests/deploy/test_prometheus_rules.py).
# Installs it with apt-get when running as root; otherwise stops with the exact command to run.
# Does not start the Prometheus server the package ships: the tests need only promtool.
# Idempotent and quick when already installed.
set -euo pipefail

command -v promtool >/dev/null 2>&1 && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "epu: promtool missing. Install it with:" >&2
  echo "    sudo apt-get update && sudo apt-get install -y prometheus" >&2
  exit 1
fi
# shellcheck source=scripts/apt-lock.sh
. "$(dirname "$0")/apt-lock.sh"
apt_lock
command -v promtool >/dev/null 2>&1 && exit 0  # installed by another run while this one waited
echo "epu: installing prometheus (for promtool) with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
"${APT_GET[@]}" update -qq
# policy-rc.d 101: the package must not start the Prometheus server.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; created_policy=1; fi
trap '[ "$created_policy" -eq 1 ] && rm -f "$policy"' EXIT
"${APT_GET[@]}" install -y -qq --no-install-recommends prometheus >/dev/null
command -v promtool >/dev/null 2>&1 || { echo "epu: promtool still missing after installing prometheus" >&2; exit 1; }
echo "epu: $(promtool --version 2>&1 | head -1)" >&2
