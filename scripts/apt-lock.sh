# Sourced by the ensure-*.sh scripts before they install anything with apt-get.
#
# Why: two `make test` runs started together on a fresh machine both find Slurm or promtool
# missing and both run apt-get. Unserialised, one fails on dpkg's lock, and one removes the
# policy-rc.d the other relies on to keep the packages' daemons stopped. apt_lock holds an
# exclusive lock for the rest of the calling script (fd 9, released when it exits); apt-get also
# waits for a dpkg lock held by anyone else (unattended-upgrades) instead of failing.
# EPU_APT_LOCK moves the lock file (tests only).

APT_WAIT_SECONDS=${APT_WAIT_SECONDS:-1200}
APT_GET=(apt-get -o "DPkg::Lock::Timeout=${APT_WAIT_SECONDS}")

apt_lock() {
  local lock=${EPU_APT_LOCK:-/var/lock/epu-apt.lock}
  exec 9>"$lock"
  if ! flock -n 9; then
    echo "epu: waiting for another EPU package install to finish ($lock)" >&2
    flock -w "$APT_WAIT_SECONDS" 9 || { echo "epu: $lock still held after ${APT_WAIT_SECONDS}s" >&2; exit 1; }
  fi
}
