#!/usr/bin/env bash
# Make sure the system services the test suite talks to are running: RabbitMQ and PostgreSQL.
# Start them if installed; install them with apt-get when running as root; otherwise stop
# with the exact command to run. Idempotent: quick when everything is already up.
set -euo pipefail

need_root() {
  echo "epu: $1 is not installed. Install it with:" >&2
  echo "    sudo apt-get update && sudo apt-get install -y $2" >&2
  exit 1
}

apt_install() {
  if [ "$(id -u)" -ne 0 ]; then need_root "$1" "$2"; fi
  echo "epu: installing $2 with apt-get" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $2 >/dev/null
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
RABBIT_PORT=${EPU_RABBIT_PORT:-5672}  # another port only for this script's own test
if ! port_open "$RABBIT_PORT"; then
  command -v rabbitmq-server >/dev/null || apt_install RabbitMQ rabbitmq-server
  echo "epu: starting RabbitMQ (open files: up to $RABBIT_NOFILE)" >&2
  if [ "$(id -u)" -eq 0 ]; then
    ( ulimit -n "$RABBIT_NOFILE" 2>/dev/null || ulimit -n "$(ulimit -Hn)"; rabbitmq-server -detached ) || true
  else
    echo "epu: RabbitMQ is installed but not running; start it with: sudo sh -c 'ulimit -n $RABBIT_NOFILE; rabbitmq-server -detached'" >&2; exit 1; fi
  wait_port "$RABBIT_PORT" RabbitMQ
fi
if [ "$(id -u)" -eq 0 ]; then
  rabbitmqctl await_startup >/dev/null 2>&1 || true
  # one started before (by hand, or by an older version of this script) may have the shell's limit
  limit=$(rabbitmqctl eval 'file_handle_cache:get_limit().' 2>/dev/null | tr -dc '0-9')
  if [ -n "$limit" ] && [ "$limit" -lt 10000 ]; then
    echo "epu: warning: RabbitMQ may use only $limit file handles (its open-file limit is too low for" \
         "the suite's peaks); when nobody else uses it, restart it with:" \
         "rabbitmqctl stop && sh -c 'ulimit -n $RABBIT_NOFILE; rabbitmq-server -detached'" >&2
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
