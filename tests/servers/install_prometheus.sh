#!/usr/bin/env bash
# Install the Prometheus server binary for the real_servers tests (Debian/Ubuntu, apt).
#
# Idempotent: does nothing when `prometheus` is already on PATH. The tests start the
# binary by hand on a free loopback port, so no service must be left running: while
# installing, a policy-rc.d that forbids service starts is put in place (unless one
# already exists) and removed afterwards.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1; then
    echo "prometheus already installed: $(command -v prometheus)"
    prometheus --version 2>&1 | head -n 1
    exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "install_prometheus.sh: not root and sudo is not available" >&2
        exit 1
    fi
    SUDO=(sudo)
fi

POLICY=/usr/sbin/policy-rc.d
created_policy=0
cleanup() {
    if [ "$created_policy" -eq 1 ]; then
        "${SUDO[@]}" rm -f "$POLICY"
    fi
}
trap cleanup EXIT

if [ ! -e "$POLICY" ]; then
    # exit 101 = "action forbidden": invoke-rc.d / deb-systemd-invoke will not start services.
    printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$POLICY" >/dev/null
    "${SUDO[@]}" chmod 0755 "$POLICY"
    created_policy=1
fi

"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=600 prometheus

if ! command -v prometheus >/dev/null 2>&1; then
    echo "install_prometheus.sh: prometheus is still not on PATH after apt-get install" >&2
    exit 1
fi
prometheus --version 2>&1 | head -n 1

# The harness never uses :9090; a daemon there is not ours, but say so.
if command -v pgrep >/dev/null 2>&1 && pgrep -x prometheus >/dev/null 2>&1; then
    echo "note: a prometheus daemon is running (not started by the tests; they never use :9090)" >&2
fi
