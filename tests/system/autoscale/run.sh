#!/bin/sh
# The tests on Ray's fake autoscaling cluster, in a private PID, mount and network namespace:
# `ray start` and `ray stop --force` there see only this namespace's processes, and its own
# /tmp/ray, so no other Ray on the host is touched. `make test` runs this after the main
# suite. Needs root (or user namespaces): `unshare --pid --fork --mount-proc --net`.
#   usage: unshare --pid --fork --mount-proc --net sh tests/system/autoscale/run.sh [pytest args]
set -e
ip link set lo up
mkdir -p /tmp/ray
mount -t tmpfs tmpfs /tmp/ray
export ARRAYJOB_FAKE_CLUSTER=1
exec "${PYTHON:-.venv/bin/python}" -m pytest tests/system/autoscale -p no:cacheprovider "$@"
