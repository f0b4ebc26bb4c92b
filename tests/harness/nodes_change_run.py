"""Run a sized job (``runner.run(nodes=2)``, as ``arrayjob run --nodes 2``) while the cluster's
nodes change under it: a worker node added during the fit ("added"), then, in a second run,
one removed ("removed"), then a node added during a PageRank, whose graph is kept between
iterations ("kept").

Runs in the session's multi-node cluster harness (``tests/harness/cluster_harness.py``), which calls
``run_cases``: two worker nodes of two CPUs each are added, and each run is held after an
iteration of its fit (``arrayjob.runtime.supervision.pause``) until the node has joined, or the GCS has
marked it dead. Returns per case the report (or the error) and the node id changed.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

SPEC = """
[job]
name = "nodes-change"
algorithm = "{algorithm}"

[inputs]
{inputs}

[params]
{params}

[output]
uri = "{root}/{out}"

[cluster]
address = "{address}"
scale_timeout = "30s"
"""

# two CPUs a node: PageRank blocks its graph by workers, two blocks a node here, so a third
# node takes some of the kept blocks (moved once, not fetched by every iteration)
NODE = {"num_cpus": 2, "object_store_memory": 80 * 2**20}
HOLD_AT = "fit:2"  # the change lands with iterations still to run
ROWS, COLS, CHUNK_ROWS = 40_000, 16, 5_000
GRAPH_NODES, EDGES, GRAPH_CHUNK = 10_000, 200_000, 25_000
PAGERANK_ITERATIONS = 40


def make_data(root: Path) -> None:
    from arrayjob.datagen import DatagenRequest, generate
    from arrayjob.io.locations import StorageOptions, parse_uri

    generate("logreg", DatagenRequest(parse_uri(str(root / "data")), ROWS, COLS, CHUNK_ROWS, 0, StorageOptions()))
    generate("pagerank", DatagenRequest(parse_uri(str(root / "graph")), GRAPH_NODES, 2, GRAPH_CHUNK, 0,
                                        StorageOptions(), edges=EDGES))


def run_cases(harness: Any, workdir: str) -> dict[str, dict[str, Any]]:
    from arrayjob import runner
    from arrayjob.runtime.metrics import RunMetrics
    from arrayjob.runtime.supervision.pause import hold
    from arrayjob.spec import load_spec

    root = Path(workdir)
    make_data(root)
    jobs = {
        "logreg": (f'X = "{root}/data/X.zarr"\ny = "{root}/data/y.zarr"', 'solver = "lbfgs"\nmax_iter = 60\ntol = 1e-12'),
        "pagerank": (f'edges = "{root}/graph/edges.zarr"',
                     f"damping = 0.99\ntol = 1e-300\nmax_iter = {PAGERANK_ITERATIONS}"),
    }
    harness.use_workers(2, **NODE)
    outcome: dict[str, dict[str, Any]] = {}
    for case, algorithm in (("added", "logreg"), ("removed", "logreg"), ("kept", "pagerank")):
        harness.wait_idle()  # the last run's workers are gone
        inputs, params = jobs[algorithm]
        path = root / f"{case}.toml"
        path.write_text(SPEC.format(root=root, out=case, algorithm=algorithm, inputs=inputs, params=params,
                                    address=harness.address))
        changed: list[str] = []

        def change(point: str, case: str = case, changed: list[str] = changed) -> None:
            if case == "removed":
                victim = harness.workers[-1]
                changed.append(victim.node_id)
                harness.kill(victim)
            else:
                changed.append(harness.add_node(**NODE).node_id)

        metrics = RunMetrics()
        hold(metrics, [HOLD_AT], change)
        started = time.perf_counter()
        try:
            done = runner.run(load_spec(str(path)), nodes=len(harness.cpu_node_ids()), metrics=metrics)
            # as ``arrayjob run --json`` prints it
            outcome[case] = {"ok": True, "report": json.loads(json.dumps(done.report, default=str))}
        except BaseException:  # noqa: BLE001 - the test shows it
            outcome[case] = {"ok": False, "error": traceback.format_exc()[-3000:]}
        outcome[case]["changed"] = changed[0] if changed else None
        print(f"nodes change: {case} {time.perf_counter() - started:.2f} s", file=sys.stderr, flush=True)
    return outcome
