#!/bin/sh
# `make test`: mypy, the import contracts and the suite, at once where they can be. From the
# repository's root, with .venv installed:
#   sh tests/run.sh [pytest args for the suite]
#
# The suite runs on two pytest workers (pytest-xdist, --dist loadgroup): it waits on Ray
# starting, nodes joining and dying and jobs' processes more than it computes, and a second
# worker fills that idle CPU. The tests that start clusters of many processes (the multi-node
# harness, the Ray job server) run one after another on one worker, and the tests that share a
# module's fixture stay on one worker (tests/conftest.py groups them). The fake autoscaling
# cluster of tests/system/autoscale (run in a namespace of its own by tests/system/test_fake_cluster.py)
# comes after the suite, alone. TEST_WORKERS sets the workers (2; 3 took the suite from 485 to
# 450 s on this machine, quiet, with more contention for a machine that may be slower).
# mypy runs in the background beside it; its output is kept in .arrayjob/test/mypy.log and
# shown when the suite ends. The exit status is 1 if any of them failed.
set -u
BIN=${BIN:-.venv/bin}
logs=.arrayjob/test
mkdir -p "$logs"

"$BIN/mypy" >"$logs/mypy.log" 2>&1 &
mypy=$!
# a background job ignores SIGINT: Ctrl-C (or make's SIGTERM) ends it here
trap 'kill $mypy 2>/dev/null; exit 130' INT
trap 'kill $mypy 2>/dev/null; exit 143' TERM

failed=""
# the package and the tests compiled once (uv compiled the rest at install): where
# PYTHONDONTWRITEBYTECODE is set, every arrayjob process and Ray worker compiled them again
"$BIN/python" -m compileall -q arrayjob tests >/dev/null || failed="$failed compileall"
"$BIN/lint-imports" --no-cache || failed="$failed lint-imports"
"$BIN/python" -m pytest -n "${TEST_WORKERS:-2}" --dist loadgroup -m "not autoscale" "$@" || failed="$failed pytest"
# The fake autoscaling cluster's tests last, in a pytest process of their own once the suite's
# Rays are gone: never beside another Ray (they run in a private namespace too, see
# tests/system/test_fake_cluster.py)
"$BIN/python" -m pytest -m autoscale tests/system/test_fake_cluster.py || failed="$failed autoscale"

echo "== mypy ($logs/mypy.log)"
wait $mypy || failed="$failed mypy"
cat "$logs/mypy.log"

if [ -n "$failed" ]; then
    echo "make test: failed:$failed"
    exit 1
fi
