"""The models of issue 26 — multinomial and elastic-net logistic regression, elastic-net linear
regression, PCA, Gaussian mixtures, ALS — and batch scoring (``predict``): arrayjob against
scikit-learn (for ALS, which scikit-learn lacks: NumPy + SciPy, vectorised) on the same data in
memory, time and result agreement side by side in one run.

    .venv/bin/python benchmarks/models.py [--size full|quick|tiny] [--only multinomial,pca,...] [--repeat 3]
                                          [--workdir DIR] [--json FILE] [--markdown FILE]
    make bench BENCH_SIZE=quick         # the same, after bench.py, outofcore.py and bench_sparse.py

Data are written once by ``arrayjob datagen`` (the configs' own generators) into ``--workdir``
(default .arrayjob/bench/models/SIZE; ``datagen.json`` says they are complete) and reused.
Sizes: ``full`` (the issue's "a good part of this machine's memory": 4,000,000 rows, X of
1.0 GB for the logistic and linear rows, 2.0 GB for PCA (64 columns); ALS 1,000,000 users ×
50,000 items, 40 ratings a user, 40 million ratings; with scikit-learn's copies and Spark's
cache beside arrayjob's blocks that is several times X: run it on a quiet machine), ``quick``
(200,000 rows; ALS 50,000 users × 5,000 items, 20 ratings a user) and ``tiny`` (2,000 rows:
tests/system/benchmarks/test_bench_models.py runs it).

*arrayjob*: one ``arrayjob run`` of each model's spec, in this process, on one local Ray this
benchmark starts once (as the runner reuses an initialised Ray: the ``connect`` stage is then
nothing, and no row pays Ray's start); seconds = the report's ``fit`` stage (``score`` for
predict) / the passes or iterations the unit names; load = its ``load`` stage (storage to the
workers). *scikit-learn*: the same fit on the arrays read with zarr into memory (load = that
read), the median of ``--repeat`` runs after a warm-up, threads as it chooses. The note of
each peer row says how its result agrees with arrayjob's published one.

*Spark MLlib* (issue 28): a row per workload, by benchmarks/bench_spark_models.py (the rows and
the comparisons) and benchmarks/spark_models.py (Spark's fits, a process of its own, with
spark_peer.py's session): the same arrays as Parquet, cached and counted, then
LogisticRegression (multinomial; elastic net by OWL-QN), LinearRegression (elastic net),
ml.feature.PCA, mllib GaussianMixture from the same start and ml ALS (its own start: objective
and RMSE compared), the median of ``--repeat`` fits after a warm-up in one session; the note
says how its result agrees with arrayjob's and which parameters it was given. Not at the tiny
size (the test suite starts no JVM) nor without pyspark and Java >= 17: the row says why.
Scoring (predict): MLlib's own multinomial model of the same data (it takes no given
coefficients), fitted once untimed, then ``transform`` written as Parquet, per pass; its labels
are compared by their counts per class.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import bench_spark_models  # noqa: E402
from bench_harness import (  # noqa: E402
    Row,
    Timing,
    commit,
    finish,
    machine_line,
    markdown,
    script_arguments,
    timed,
    versions,
)


@dataclass(frozen=True)
class Size:
    rows: int  # logreg, linreg, pca, gmm
    chunk_rows: int
    cols: int  # logreg, linreg
    pca_cols: int
    gmm_cols: int
    users: int  # ALS
    items: int
    per_user: int


SIZES = {
    "full": Size(4_000_000, 250_000, 32, 64, 8, 1_000_000, 50_000, 40),
    "quick": Size(200_000, 25_000, 32, 64, 8, 50_000, 5_000, 20),
    "tiny": Size(2_000, 500, 8, 12, 4, 500, 100, 8),
}
CLASSES, L2 = 4, 1e-4  # multinomial logreg
L1_EN, L2_EN = 1e-3, 1e-3  # the elastic-net rows
PCA_K, GMM_K, GMM_ITER, ALS_RANK, ALS_ITER, ALS_L2 = 8, 4, 10, 8, 5, 0.1
def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def arrayjob(*args: str) -> tuple[int, str, str]:
    """``arrayjob ARGS`` in this process (on this process's Ray, once started): exit code, stdout, stderr."""
    from arrayjob.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def read(path: Path) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_array(str(path), mode="r")[...])


def write(path: Path, value: np.ndarray) -> None:
    import zarr

    zarr.create_array(store=str(path), shape=value.shape, chunks=value.shape, dtype="float64",
                      overwrite=True)[...] = value


# -- data ------------------------------------------------------------------------------------


def prepare(work: Path, name: str, algorithm: str, *options: str) -> Path:
    """``arrayjob datagen ALGORITHM`` into work/name, once per options."""
    data = work / name
    marker = data / "datagen.json"
    wanted = {"algorithm": algorithm, "options": list(options)}
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return data
    marker.unlink(missing_ok=True)
    log(f"{name}: arrayjob datagen {algorithm} {' '.join(options)}")
    code, _, err = arrayjob("datagen", algorithm, str(data), *options)
    if code != 0:
        raise SystemExit(f"datagen failed: {err.strip()}")
    marker.write_text(json.dumps(wanted))
    return data


def run_job(work: Path, name: str, algorithm: str, inputs: dict[str, Path], params: str) -> dict[str, Any]:
    """One ``arrayjob run``: its report and the published result's arrays, or {"error": ...}."""
    import zarr

    runs = work / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    output = runs / f"{name}-out"
    body = "".join(f'{key} = "{path}"\n' for key, path in inputs.items())
    spec = runs / f"{name}.toml"
    spec.write_text(f'[job]\nname = "bench-{name}"\nalgorithm = "{algorithm}"\n\n[inputs]\n{body}\n'
                    f'[params]\n{params}\n[output]\nuri = "{output}"\n\n[run]\ncheckpoint_every = 3600\n')
    code, out, err = arrayjob("run", str(spec), "--json", "--overwrite")
    if code != 0:
        return {"error": (err.strip().splitlines() or [f"exit {code}"])[-1][:500]}
    report = json.loads(out)
    prefix = json.loads((output / "_SUCCESS").read_text())["prefix"]
    group = zarr.open_group(str(output / prefix / "result.zarr"), mode="r")
    report["arrays"] = {key: np.asarray(group[key][...]) for key in group.array_keys()}
    report["output"] = output
    return report


def stage(report: dict[str, Any], name: str) -> float:
    return float(next(s["wall_seconds"] for s in report["stages"] if s["name"] == name))


# -- rows ------------------------------------------------------------------------------------


@dataclass
class Case:
    """One workload's rows, as they are measured."""

    workload: str
    size: str
    unit: str
    rows: list[Row]

    def arrayjob(self, report: dict[str, Any], passes: int | None, what: str, work_stage: str = "fit") -> None:
        if "error" in report:
            self.rows.append(Row(self.workload, self.size, "arrayjob", self.unit, arrayjob=True, peer=False,
                                 note=f"failed: {report['error']}"))
            return
        seconds = stage(report, work_stage)
        per = seconds / max(1, passes or 1)
        extra = {k: v for k, v in report["result"].items() if isinstance(v, (int, float, str, bool))}
        extra |= {"stage_seconds": seconds, "passes": passes, "tasks": report["tasks"]["count"]}
        self.rows.append(Row(self.workload, self.size, "arrayjob", self.unit, stage(report, "load"), per,
                             arrayjob=True, peer=False, extra=extra,
                             note=f"{what}: {work_stage} stage {seconds:.3g} s"
                                  + (f" / {passes}" if passes else "") + f"; {report['tasks']['count']} tasks"))

    def peer(self, system: str, load_s: float | None, t: Timing | None, note: str, **extra: Any) -> None:
        # plain floats: a NumPy scalar (a time over n_iter_) would reach the JSON as a string
        self.rows.append(Row(self.workload, self.size, system, self.unit, load_s, float(t.median) if t else None,
                             compute_runs=[float(r) for r in t.runs] if t else [], note=note, extra=extra))


def loaded(*paths: Path) -> tuple[list[np.ndarray], float]:
    start = time.perf_counter()
    arrays = [read(p) for p in paths]
    return arrays, time.perf_counter() - start


def quiet(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` without scikit-learn's ConvergenceWarning (the rows stop at a fixed iteration count)."""
    def run() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()
    return run


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    """max |a − b| / max |b|."""
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


# -- the workloads ---------------------------------------------------------------------------


def multinomial(work: Path, s: Size, case: Case, repeat: int, state: dict[str, Any]) -> None:
    from sklearn.linear_model import LogisticRegression

    data = prepare(work, "multinomial", "logreg", "--rows", str(s.rows), "--cols", str(s.cols), "--chunk-rows",
                   str(s.chunk_rows), "--classes", str(CLASSES))
    report = run_job(work, "multinomial", "logreg", {"X": data / "X.zarr", "y": data / "y.zarr"},
                     f'family = "multinomial"\nclasses = {CLASSES}\nl2 = {L2}\nmax_iter = 100\ntol = 1e-6\n')
    state["multinomial"] = (data, report)
    case.arrayjob(report, report.get("result", {}).get("iterations"), "L-BFGS to ‖grad‖ ≤ 1e-6")
    (X, y), load_s = loaded(data / "X.zarr", data / "y.zarr")
    fits: list[Any] = []
    t = timed(quiet(lambda: fits.append(LogisticRegression(C=1 / (L2 * len(y)), max_iter=100, tol=1e-6).fit(X, y))),
              repeat)
    ref = fits[-1]
    per = Timing(t.median / ref.n_iter_[0], [r / ref.n_iter_[0] for r in t.runs])
    note = f"LogisticRegression(lbfgs, C = 1/(l2·n)): fit {t.median:.3g} s / {ref.n_iter_[0]} iterations"
    if "error" not in report:
        coef = report["arrays"]["coef"]
        note += (f"; arrayjob's coef agrees to {agreement(coef, ref.coef_):.1e} of its largest "
                 f"({report['result']['iterations']} iterations)")
    case.peer("scikit-learn", load_s, per, note, n_iter=int(ref.n_iter_[0]), fit_seconds=t.median)
    state["multinomial_sklearn"] = (X, ref)
    state.setdefault("spark", {})["multinomial"] = {"X": X, "y": y, "report": report, "l2": L2, "tol": 1e-6}


def elastic_logreg(work: Path, s: Size, case: Case, repeat: int, state: dict[str, Any]) -> None:
    from sklearn.linear_model import LogisticRegression

    data = prepare(work, "binary", "logreg", "--rows", str(s.rows), "--cols", str(s.cols), "--chunk-rows",
                   str(s.chunk_rows))
    report = run_job(work, "elastic-logreg", "logreg", {"X": data / "X.zarr", "y": data / "y.zarr"},
                     f"l1 = {L1_EN}\nl2 = {L2_EN}\nmax_iter = 500\ntol = 1e-8\n")
    case.arrayjob(report, None, f"OWL-QN, l1 = l2 = {L1_EN}, to ‖pseudo-gradient‖ ≤ 1e-8 "
                                f"({report.get('result', {}).get('iterations')} iterations)")
    (X, y), load_s = loaded(data / "X.zarr", data / "y.zarr")
    fits: list[Any] = []
    t = timed(quiet(lambda: fits.append(LogisticRegression(C=1 / (len(y) * (L1_EN + L2_EN)), l1_ratio=0.5,
                                                           solver="saga", tol=1e-8, max_iter=10_000).fit(X, y))),
              repeat)
    ref = fits[-1]
    note = f"LogisticRegression(saga, l1_ratio = 0.5, tol 1e-8): {ref.n_iter_[0]} epochs"
    if "error" not in report:
        coef = report["arrays"]["coef"]
        zeros = int((coef == 0).sum()), int((ref.coef_ == 0).sum())
        note += f"; coef agrees to {agreement(coef, ref.coef_[0]):.1e}, exact zeros {zeros[0]} (sklearn {zeros[1]})"
    case.peer("scikit-learn", load_s, t, note, n_iter=int(ref.n_iter_[0]))
    state.setdefault("spark", {})["elastic-logreg"] = {
        "X": X, "y": y, "report": report, "l1": L1_EN, "l2": L2_EN, "tol": 1e-8}


def elastic_linreg(work: Path, s: Size, case: Case, repeat: int, state: dict[str, Any]) -> None:
    from sklearn.linear_model import ElasticNet

    data = prepare(work, "linreg", "linreg", "--rows", str(s.rows), "--cols", str(s.cols), "--chunk-rows",
                   str(s.chunk_rows))
    report = run_job(work, "elastic-linreg", "linreg", {"X": data / "X.zarr", "y": data / "y.zarr"},
                     f"l1 = {L1_EN}\nl2 = {L2_EN}\n")
    case.arrayjob(report, None, f"OWL-QN, l1 = l2 = {L1_EN} ({report.get('result', {}).get('iterations')} iterations)")
    (X, y), load_s = loaded(data / "X.zarr", data / "y.zarr")
    fits: list[Any] = []
    t = timed(quiet(lambda: fits.append(ElasticNet(alpha=L1_EN + L2_EN, l1_ratio=0.5, tol=1e-10,
                                                   max_iter=100_000).fit(X, y))), repeat)
    ref = fits[-1]
    note = f"ElasticNet(alpha = l1 + l2, l1_ratio = 0.5, tol 1e-10), coordinate descent: {ref.n_iter_} epochs"
    if "error" not in report:
        note += f"; coef agrees to {agreement(report['arrays']['coef'], ref.coef_):.1e}"
    case.peer("scikit-learn", load_s, t, note, n_iter=int(ref.n_iter_))
    state.setdefault("spark", {})["elastic-linreg"] = {
        "X": X, "y": y, "report": report, "l1": L1_EN, "l2": L2_EN, "tol": 1e-10}


def pca(work: Path, s: Size, case: Case, repeat: int, state: dict[str, Any]) -> None:
    from sklearn.decomposition import PCA

    data = prepare(work, "pca", "pca", "--rows", str(s.rows), "--cols", str(s.pca_cols), "--chunk-rows",
                   str(s.chunk_rows), "--rank", str(PCA_K))
    report = run_job(work, "pca", "pca", {"X": data / "X.zarr"}, f'k = {PCA_K}\nmethod = "exact"\n')
    case.arrayjob(report, None, "exact: TSQR's R, then its SVD on the driver")
    (X,), load_s = loaded(data / "X.zarr")
    fits: list[Any] = []
    t = timed(lambda: fits.append(PCA(PCA_K, svd_solver="full").fit(X)), repeat)
    ref = fits[-1]
    note = "PCA(svd_solver='full')"
    if "error" not in report:
        variance = agreement(report["arrays"]["explained_variance"], ref.explained_variance_)
        cosines = np.abs(np.einsum("ij,ij->i", report["arrays"]["components"], ref.components_))
        note += f"; explained variance agrees to {variance:.1e}, components to 1 − {abs(1 - cosines.min()):.1e} (|cos|)"
    case.peer("scikit-learn", load_s, t, note)
    state.setdefault("spark", {})["pca"] = {"X": X, "report": report, "k": PCA_K}


def gmm(work: Path, s: Size, case: Case, repeat: int, state: dict[str, Any]) -> None:
    from sklearn.mixture import GaussianMixture

    data = prepare(work, "gmm", "gmm", "--rows", str(s.rows), "--cols", str(s.gmm_cols), "--chunk-rows",
                   str(s.chunk_rows), "--k", str(GMM_K))
    (X,), load_s = loaded(data / "X.zarr")
    means = X[np.random.default_rng(3).choice(len(X), GMM_K, replace=False)]
    write(data / "init.zarr", means)
    report = run_job(work, "gmm", "gmm", {"X": data / "X.zarr"},
                     f'k = {GMM_K}\ninit = "{data / "init.zarr"}"\nmax_iter = {GMM_ITER}\ntol = 0\n')
    case.arrayjob(report, report.get("result", {}).get("iterations"), "EM, full covariances, from the given means")
    d = X.shape[1]
    precision = np.linalg.inv(np.cov(X.T, bias=True).reshape(d, d) + 1e-6 * np.eye(d))
    fits: list[Any] = []
    t = timed(quiet(lambda: fits.append(GaussianMixture(GMM_K, tol=0, max_iter=GMM_ITER, means_init=means,
                                                        weights_init=np.full(GMM_K, 1 / GMM_K),
                                                        precisions_init=np.repeat(precision[None], GMM_K, 0)).fit(X))),
              repeat)
    ref = fits[-1]
    per = Timing(t.median / ref.n_iter_, [r / ref.n_iter_ for r in t.runs])
    note = f"GaussianMixture(full) from the same means, weights and covariances: {ref.n_iter_} iterations"
    if "error" not in report:
        note += (f"; means agree to {agreement(report['arrays']['means'], ref.means_):.1e}, lower bound "
                 f"{ref.lower_bound_:.10g} (arrayjob's {report['result']['lower_bound']:.10g})")
    case.peer("scikit-learn", load_s, per, note, n_iter=int(ref.n_iter_))
    state.setdefault("spark", {})["gmm"] = {
        "X": X, "report": report, "means": means, "max_iter": GMM_ITER, "data": data}


def als_numpy(R: Any, Y: np.ndarray, l2: float, iterations: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Explicit weighted-λ ALS from item factors Y, every user's (item's) r × r system at once: the
    Gram matrices summed over each row's ratings (``np.add.reduceat`` on the CSR order, in slices
    of rows), then one batched ``np.linalg.solve``. Returns X, Y and the last objective."""
    rank = Y.shape[1]
    rows, columns = R.tocsr(), R.tocsc().T.tocsr()

    def half(M: Any, F: np.ndarray) -> np.ndarray:
        counts = np.diff(M.indptr)
        out = np.zeros((M.shape[0], rank))
        step = max(1, 2_000_000 // max(1, int(counts.mean() or 1)))  # ~2M ratings a slice: 1 GB of outer products
        for a in range(0, M.shape[0], step):
            b = min(M.shape[0], a + step)
            lo, hi = M.indptr[a], M.indptr[b]
            theirs, r = F[M.indices[lo:hi]], M.data[lo:hi]
            some = counts[a:b] > 0
            starts = (M.indptr[a:b] - lo)[some]
            gram = np.add.reduceat(theirs[:, :, None] * theirs[:, None, :], starts, axis=0)
            rhs = np.add.reduceat(theirs * r[:, None], starts, axis=0)
            gram += l2 * counts[a:b][some][:, None, None] * np.eye(rank)
            out[a:b][some] = np.linalg.solve(gram, rhs[..., None])[..., 0]
        return out

    for _ in range(iterations):
        X = half(rows, Y)
        Y = half(columns, X)
    coo = rows.tocoo()
    residual = coo.data - np.einsum("ij,ij->i", X[coo.row], Y[coo.col])
    objective = float(residual @ residual + l2 * (np.diff(rows.indptr) @ np.sum(X**2, axis=1)
                                                  + np.diff(columns.indptr) @ np.sum(Y**2, axis=1)))
    return X, Y, objective


def als(work: Path, s: Size, case: Case, repeat: int, state: dict[str, Any]) -> None:
    import scipy.sparse
    import zarr

    data = prepare(work, "als", "als", "--rows", str(s.users), "--cols", str(s.items), "--nnz-per-row",
                   str(s.per_user), "--rank", str(ALS_RANK), "--chunk-rows", str(max(s.users // 8, 1)))
    Y0 = np.random.default_rng(5).standard_normal((s.items, ALS_RANK)) / np.sqrt(ALS_RANK)
    write(data / "init.zarr", Y0)
    report = run_job(work, "als", "als", {"R": data / "R.zarr"},
                     f'rank = {ALS_RANK}\nl2 = {ALS_L2}\nmax_iter = {ALS_ITER}\ninit = "{data / "init.zarr"}"\n')
    case.arrayjob(report, report.get("result", {}).get("iterations"), "explicit, weighted-λ, from the same item factors")
    start = time.perf_counter()
    group = zarr.open_group(str(data / "R.zarr"), mode="r")
    R = scipy.sparse.csr_matrix((group["data"][:], group["indices"][:], group["indptr"][:]),
                                shape=tuple(group.attrs["shape"]))
    load_s = time.perf_counter() - start
    out: list[Any] = []
    t = timed(lambda: out.append(als_numpy(R, Y0, ALS_L2, ALS_ITER)), repeat)
    per = Timing(t.median / ALS_ITER, [r / ALS_ITER for r in t.runs])
    X, Y, objective = out[-1]
    note = f"the same updates in NumPy, every r × r system of a half-iteration in one batched solve; objective {objective:.10g}"
    if "error" not in report:
        ours = report["result"]["objective"]
        ours = float(ours[-1] if isinstance(ours, list) else ours)
        note += (f" (arrayjob's {ours:.10g}); user factors agree to "
                 f"{agreement(report['arrays']['user_factors'], X):.1e}")
    case.peer("NumPy + SciPy (no scikit-learn ALS)", load_s, per, note)
    state.setdefault("spark", {})["als"] = {
        "R": R, "report": report, "rank": ALS_RANK, "l2": ALS_L2, "max_iter": ALS_ITER}


def predict(work: Path, s: Size, case: Case, repeat: int, state: dict[str, Any]) -> None:
    if "multinomial" not in state:
        multinomial(work, s, Case("multinomial logreg", case.size, case.unit, []), repeat, state)
    data, model = state["multinomial"]
    if "error" in model:
        case.rows.append(Row(case.workload, case.size, "arrayjob", case.unit, arrayjob=True, peer=False,
                             note=f"no model: {model['error']}"))
        return
    report = run_job(work, "predict", "predict", {"model": model["output"], "X": data / "X.zarr"}, "")
    case.arrayjob(report, None, "label and probability (n, 4), written by the workers", work_stage="score")
    from sklearn.linear_model import LogisticRegression

    X, _ = state["multinomial_sklearn"]
    _, load_s = loaded(data / "X.zarr")
    estimator = LogisticRegression()  # predict's model, as `arrayjob export` builds it
    estimator.coef_, estimator.intercept_ = model["arrays"]["coef"], model["arrays"]["intercept"]
    estimator.classes_, estimator.n_features_in_ = np.arange(CLASSES), X.shape[1]
    got: list[Any] = []
    t = timed(lambda: got.append((estimator.predict(X), estimator.predict_proba(X))), repeat)
    note = "the model's LogisticRegression: predict + predict_proba, in memory (nothing written)"
    if "error" not in report:
        labels, proba = got[-1]
        written = report["arrays"]
        same = float(np.mean(labels == written["label"]))
        note += (f"; labels equal on {same:.2%} of rows, probabilities agree to "
                 f"{agreement(written['probability'], proba):.1e}")
    case.peer("scikit-learn", load_s, t, note)
    fitted = state.get("spark", {}).get("multinomial")
    if fitted is not None:  # Spark's column: its own model of the same data scoring the same X
        state["spark"]["predict"] = {**fitted, "report": report, "coef": model["arrays"]["coef"], "classes": CLASSES,
                                     "out": str(work / "predict" / "spark-scores")}


WORKLOADS: dict[str, tuple[str, str, Callable[..., None]]] = {  # name -> (workload, unit, function)
    "multinomial": ("multinomial logreg", "per L-BFGS iteration", multinomial),
    "elastic-logreg": ("elastic-net logreg", "per fit", elastic_logreg),
    "elastic-linreg": ("elastic-net linreg", "per fit", elastic_linreg),
    "pca": ("PCA", "per fit", pca),
    "gmm": ("GMM", "per EM iteration", gmm),
    "als": ("ALS", "per iteration", als),
    "predict": ("predict", "per pass over X", predict),
}


def describe(name: str, s: Size) -> str:
    if name == "als":
        return f"R {s.users:,} × {s.items:,}, {s.per_user} ratings a user, rank {ALS_RANK}"
    cols = {"pca": s.pca_cols, "gmm": s.gmm_cols}.get(name, s.cols)
    extra = {"multinomial": f", {CLASSES} classes", "predict": f", {CLASSES} classes", "pca": f", k = {PCA_K}",
             "gmm": f", k = {GMM_K}"}.get(name, "")
    return f"X {s.rows:,} × {cols}{extra}"


def main() -> int:
    args, only = script_arguments(__doc__.splitlines()[0], SIZES, WORKLOADS, REPO / ".arrayjob" / "bench" / "models")
    import ray

    size = SIZES[args.size]
    work = args.workdir.resolve() / args.size
    work.mkdir(parents=True, exist_ok=True)
    os.environ.pop("RAY_ADDRESS", None)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = time.perf_counter()
    doc: dict[str, Any] = {"size": args.size, "sizes": size.__dict__, "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
                           "commit": commit(), "machine": machine_line(), "versions": versions(),
                           "repeat": args.repeat, "load_average_start": os.getloadavg(), "complete": False}
    log(f"size {args.size}; {machine_line()}; starting one local Ray for every arrayjob run")
    start_ray(ray)
    rows: list[Row] = []
    state: dict[str, Any] = {}

    def write_out(complete: bool = False) -> None:
        finish(rows)
        body = {**doc, "complete": complete, "load_average_end": os.getloadavg(), "rows": [r.as_dict() for r in rows]}
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(body, indent=1, default=str))
        if args.markdown:
            args.markdown.parent.mkdir(parents=True, exist_ok=True)
            args.markdown.write_text(table(doc, rows))

    try:
        for name in only:
            workload, unit, measure = WORKLOADS[name]
            case = Case(workload, describe(name, size), unit, [])
            log(f"{workload}: {case.size}")
            measure(work, size, case, args.repeat, state)
            case.rows.append(bench_spark_models.model_row(name, workload, case.size, unit, work, args.size,
                                                          args.repeat, state))
            for row in case.rows:
                row.extra.setdefault("load_average", os.getloadavg()[0])
                log(f"{workload}: {row.system}: " + (f"{row.compute_s:.4g} s {unit}" if row.compute_s else row.note))
            rows.extend(case.rows)
            write_out()
    finally:
        ray.shutdown()
    doc["seconds"] = time.perf_counter() - started
    write_out(complete=True)
    print(table(doc, rows))
    log(f"{time.perf_counter() - started:.0f} s in all; load average at the end {os.getloadavg()[0]:.2f}")
    return 0


def start_ray(ray: Any, tries: int = 3) -> None:
    """A local Ray for every run of this benchmark. Ray gives its raylet 30 s to register, which a
    loaded machine can miss (seen at load 40-57 on this one): try again."""
    for attempt in range(1, tries + 1):
        try:
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
            return
        except Exception as exc:  # Ray raises a bare Exception for the timeout
            ray.shutdown()
            if attempt == tries:
                raise
            log(f"Ray did not start ({exc}); trying again ({attempt + 1} of {tries})")


def table(doc: dict[str, Any], rows: list[Row]) -> str:
    load = ", ".join(f"{x:.1f}" for x in doc["load_average_start"])
    return (f"{doc['size']} size, {doc['date']}, commit {doc['commit']}; {doc['machine']} (at the start: {load})\n\n"
            f"{markdown(rows)}\n")


if __name__ == "__main__":
    sys.exit(main())
