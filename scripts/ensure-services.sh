#!/usr/bin/env bash
# Make sure the system services the test suite talks to are running: RabbitMQ and PostgreSQL.
# Start them if installed; install them with apt-get when running as root; otherwise stop
# with the exact command to run. Idempotent: quick when everything is already up.
set -euo pipefail

# Two `make test` runs started together must not both restart or start the broker: one at a time
# (root only: only root starts anything; EPU_SERVICES_LOCK only for this script's own test).
if [ "$(id -u)" -eq 0 ]; then
  exec 8>"${EPU_SERVICES_LOCK:-/var/lock/epu-services.lock}"
  flock -w 600 8 || { echo "epu: another run has held the services lock for 600s" >&2; exit 1; }
fi

need_root() {
  echo "epu: $1 is not installed. Install it with:" >&2
  echo "    sudo apt-get update && sudo apt-get install -y $2" >&2
  exit 1
}

# shellcheck source=scripts/apt-lock.sh
. "$(dirname "$0")/apt-lock.sh"

apt_install() {
  if [ "$(id -u)" -ne 0 ]; then need_root "$1" "$2"; fi
  apt_lock
  echo "epu: installing $2 with apt-get" >&2
  DEBIAN_FRONTEND=noninteractive "${APT_GET[@]}" update -qq
  DEBIAN_FRONTEND=noninteractive "${APT_GET[@]}" install -y -qq $2 >/dev/null
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
  for _ in $(seq 1 120); do port_open "$1" && return 0; sleep 0.5; done
  echo "epu: $2 did not come up on port $1" >&2; exit 1
}

# ---- RabbitMQ
# Its open-file limit: RabbitMQ 3.x keeps ~10% of it back and shares the rest between sockets,
# queue files and quorum queues' reservations (three each); at the 1,024 a shell gives, the broker
# ran out in the middle of the suite and answered nothing for 12 minutes (issue 34). 65,536 is
# what Debian's systemd unit gives it (LimitNOFILE) and what RabbitMQ recommends in production.
RABBIT_NOFILE=65536
# Debian's rabbitmq-server wrapper switches to the rabbitmq user with su, whose pam_limits resets the
# open-file limit to init's (1,024 in a container): the limit raised here would never reach the broker.
# setpriv changes user without PAM, so the broker keeps it (checked below with file_handle_cache).
# (EPU_RABBIT_SERVER and EPU_RABBIT_USER only for this script's own test.)
RABBIT_SERVER=${EPU_RABBIT_SERVER:-/usr/lib/rabbitmq/bin/rabbitmq-server}
RABBIT_USER=${EPU_RABBIT_USER:-rabbitmq}
start_rabbit() {
  ( ulimit -n "$RABBIT_NOFILE" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
    if command -v setpriv >/dev/null && id "$RABBIT_USER" >/dev/null 2>&1 && [ -x "$RABBIT_SERVER" ]; then
      home=$(getent passwd "$RABBIT_USER" | cut -d: -f6)
      cd "${home:-/}" && setpriv --reuid="$RABBIT_USER" --regid="$RABBIT_USER" --init-groups \
        env HOME="${home:-/}" "$RABBIT_SERVER" -detached
    else
      rabbitmq-server -detached
    fi )
}
RABBIT_PORT=${EPU_RABBIT_PORT:-5672}  # another port only for this script's own test
if ! port_open "$RABBIT_PORT"; then
  command -v rabbitmq-server >/dev/null || apt_install RabbitMQ rabbitmq-server
  echo "epu: starting RabbitMQ (open files: up to $RABBIT_NOFILE)" >&2
  if [ "$(id -u)" -eq 0 ]; then
    start_rabbit || true
  else
    echo "epu: RabbitMQ is installed but not running; start it with: sudo bash scripts/ensure-services.sh" >&2; exit 1; fi
  wait_port "$RABBIT_PORT" RabbitMQ
fi
if [ "$(id -u)" -eq 0 ]; then
  rabbitmqctl await_startup >/dev/null 2>&1 || true
  # one started before (by hand, or by an older version of this script) may have the shell's limit
  limit=$(rabbitmqctl eval 'file_handle_cache:get_limit().' 2>/dev/null | tr -dc '0-9')
  if [ -n "$limit" ] && [ "$limit" -lt 10000 ]; then
    # Restarted here only while no client is connected (nobody loses a connection); durable
    # queues, users and vhosts survive a restart. Otherwise the suite runs on it, with a warning.
    clients=$(rabbitmqctl list_connections -q name 2>/dev/null | grep -c . || true)
    if [ "$clients" = "0" ]; then
      echo "epu: restarting RabbitMQ: it may use only $limit file handles, too few for the suite's peaks" >&2
      rabbitmqctl stop >/dev/null 2>&1 || true
      for _ in $(seq 1 60); do port_open "$RABBIT_PORT" || break; sleep 0.5; done
      start_rabbit || true
      wait_port "$RABBIT_PORT" RabbitMQ
      rabbitmqctl await_startup >/dev/null 2>&1 || true
      limit=$(rabbitmqctl eval 'file_handle_cache:get_limit().' 2>/dev/null | tr -dc '0-9')
      echo "epu: RabbitMQ now may use $limit file handles" >&2
    else
      echo "epu: warning: RabbitMQ may use only $limit file handles (its open-file limit is too low for" \
           "the suite's peaks) and $clients clients use it; when nobody does, restart it with:" \
           "rabbitmqctl stop && sudo bash scripts/ensure-services.sh" >&2
    fi
  fi
fi

# ---- PostgreSQL
if ! port_open 5432; then
  command -v pg_ctlcluster >/dev/null || apt_install PostgreSQL postgresql
  if [ "$(id -u)" -eq 0 ]; then
    ver=$(ls /etc/postgresql | head -1)
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
  else
    echo "epu: PostgreSQL is installed but not running; start it with: sudo pg_ctlcluster \$(ls /etc/postgresql) main start" >&2; exit 1
  fi
  wait_port 5432 PostgreSQL
fi

# ---- systemd-analyze (the tests verify deploy/systemd units with it)
if ! command -v systemd-analyze >/dev/null; then
  apt_install systemd-analyze systemd
fi
