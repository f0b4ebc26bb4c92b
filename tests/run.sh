#!/bin/sh
# `make test`: mypy, the import contracts, the suite and the fake autoscaling cluster's tests,
# at once where they can be. From the repository's root, with .venv installed:
#   sh tests/run.sh [pytest args for the suite]
#
# The suite runs on two pytest workers (pytest-xdist, --dist loadgroup): the tests on the one
# multi-node cluster harness stay on one worker, and so do the tests that share a module's
# fixture (tests/conftest.py groups them). mypy and tests/autoscale (in a private PID, mount
# and network namespace of their own: tests/autoscale/run.sh) run in the background beside it,
# their output kept in .arrayjob/test/ and shown when the suite ends. The suite waits on Ray
# starting, nodes joining and dying and jobs' processes more than it computes: these fill the
# idle CPU. The exit status is 1 if any of the four failed.
set -u
BIN=${BIN:-.venv/bin}
logs=.arrayjob/test
mkdir -p "$logs"

"$BIN/mypy" >"$logs/mypy.log" 2>&1 &
mypy=$!
# --kill-child: whatever ends unshare ends the namespace, and every process in it
unshare --pid --fork --kill-child --mount-proc --net sh tests/autoscale/run.sh >"$logs/autoscale.log" 2>&1 &
autoscale=$!
# a background job ignores SIGINT: Ctrl-C (or make's SIGTERM) ends them here
trap 'kill $mypy $autoscale 2>/dev/null; exit 130' INT TERM

failed=""
# the package and the tests compiled once (uv compiled the rest at install): where
# PYTHONDONTWRITEBYTECODE is set, every arrayjob process and Ray worker compiled them again
"$BIN/python" -m compileall -q arrayjob tests >/dev/null || failed="$failed compileall"
"$BIN/lint-imports" --no-cache || failed="$failed lint-imports"
"$BIN/python" -m pytest -n 2 --dist loadgroup "$@" || failed="$failed pytest"

echo "== mypy ($logs/mypy.log)"
wait $mypy || failed="$failed mypy"
cat "$logs/mypy.log"
echo "== tests/autoscale ($logs/autoscale.log)"
wait $autoscale || failed="$failed tests/autoscale"
cat "$logs/autoscale.log"

if [ -n "$failed" ]; then
    echo "make test: failed:$failed"
    exit 1
fi
