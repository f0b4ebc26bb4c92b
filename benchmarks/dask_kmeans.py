"""dask-ml's KMeans on a Zarr X, as the peer in ``benchmarks/outofcore.py`` (issue 17).

    python benchmarks/dask_kmeans.py X.zarr --k 8 --iterations 10 [--memory-limit 300MB]

A local dask.distributed cluster of 2 single-threaded workers (this machine's 2 cores, as
arrayjob's local Ray has), X read from Zarr and persisted in the workers' memory, then
``dask_ml.cluster.KMeans`` fitted from the first k rows (no k-means|| initialisation to time)
with ``tol=0`` so it makes every iteration. ``--memory-limit`` caps each worker: dask
spills what does not fit to its local disk (its own answer to a store smaller than the
data). Prints one JSON line: seconds per iteration (the fit over its iterations), the load,
the iterations made and the inertia.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("x")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--memory-limit", default="auto")
    args = parser.parse_args()

    import dask.array as da
    import numpy as np
    from dask.distributed import Client, LocalCluster, wait
    from dask_ml.cluster import KMeans

    with tempfile.TemporaryDirectory() as spill, \
            LocalCluster(n_workers=2, threads_per_worker=1, memory_limit=args.memory_limit,
                         local_directory=spill, dashboard_address=None) as cluster, Client(cluster):
        start = time.perf_counter()
        X = da.from_zarr(args.x).persist()
        wait(X)
        load = time.perf_counter() - start
        init = np.asarray(X[: args.k].compute())
        model = KMeans(n_clusters=args.k, init=init, max_iter=args.iterations, tol=0.0, random_state=0)
        start = time.perf_counter()
        model.fit(X)
        fit = time.perf_counter() - start
    n_iter = int(model.n_iter_)
    print(json.dumps({"seconds_per_pass": fit / max(1, n_iter), "fit_seconds": fit, "load_seconds": load,
                      "iterations": n_iter, "inertia": float(model.inertia_)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
