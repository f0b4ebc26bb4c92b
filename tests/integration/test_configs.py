"""Every shipped config runs end to end on its demo data, on a local directory and on S3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness.helpers import read_result, run_cli

REPO = Path(__file__).resolve().parents[2]

DEMOS = {
    "logreg": (["--rows", "3000", "--cols", "4", "--chunk-rows", "500"], {"coef", "intercept"}),
    "logreg_multinomial": (["--rows", "3000", "--cols", "4", "--chunk-rows", "500", "--classes", "4"],
                           {"coef", "intercept"}),
    "linreg": (["--rows", "3000", "--cols", "4", "--chunk-rows", "500"], {"coef", "intercept"}),
    "kmeans": (["--rows", "3000", "--cols", "3", "--chunk-rows", "500", "--k", "8"], {"centroids", "labels"}),
    "gmm": (["--rows", "3000", "--cols", "3", "--chunk-rows", "500", "--k", "4"],
            {"weights", "means", "covariances", "labels"}),
    "tsqr": (["--rows", "3000", "--cols", "5", "--chunk-rows", "500"], {"Q", "R"}),
    "mttkrp": (["--shape", "20,15,10", "--chunk-rows", "4", "--rank", "4"], {"M"}),
    # the config's rank, as its header says: fitted to data of rank 3 it ran all 100 of its max_iter
    "cp_als": (["--shape", "20,15,10", "--chunk-rows", "4", "--rank", "8"], {"weights", "A", "B", "C"}),
    "pagerank": (["--rows", "300", "--edges", "3000", "--chunk-rows", "700"], {"rank"}),
    "pca": (["--rows", "3000", "--cols", "10", "--chunk-rows", "500", "--rank", "8"],
            {"components", "singular_values", "explained_variance", "explained_variance_ratio", "mean", "scores"}),
    "predict": ([], {"label", "probability"}),
    "als": (["--rows", "3000", "--cols", "300", "--chunk-rows", "500", "--nnz-per-row", "10"],
            {"user_factors", "item_factors"}),
    "als_table": (["--rows", "3000", "--cols", "300", "--chunk-rows", "500", "--nnz-per-row", "10", "--format",
                   "parquet"], {"user_factors", "item_factors"}),
    "predict_als": ([], {"items", "ratings"}),
}
CONFIG_NAME = {"cp_als": "cp-als", "logreg_multinomial": "logreg-multinomial", "als_table": "als-table",
               "predict_als": "predict-als"}
# configs named otherwise than their algorithm
ALGORITHM = {"logreg_multinomial": "logreg", "als_table": "als", "predict_als": "predict"}
# configs that read another demo's published output (predict: the logreg demo's model): that
# demo runs first, on its own demo data
MODEL_OF = {"predict": "logreg", "predict_als": "als"}


@pytest.fixture(params=["local", "s3"])
def bucket(request, workdir, monkeypatch):
    if request.param == "local":
        return str(workdir / "bucket"), None
    endpoint = request.getfixturevalue("s3_endpoint")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)  # for datagen on the driver
    return f"s3://{request.getfixturevalue('s3_bucket')}", endpoint


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("config", sorted(DEMOS))
def test_config_runs_on_demo_data(config, bucket, monkeypatch, capsys):
    base, endpoint = bucket
    monkeypatch.setenv("ARRAYJOB_BUCKET", base)
    args, arrays = DEMOS[config]
    algorithm = ALGORITHM.get(config, config)
    extra = ["--set", f"storage.endpoint_url={endpoint}"] if endpoint else []
    demo = MODEL_OF.get(config)
    if demo is not None:  # its model is another demo's output: that demo runs first
        code, _, err = run_cli(["datagen", demo, f"{base}/demo/{demo}", *DEMOS[demo][0]], capsys)
        assert code == 0, err
        code, _, err = run_cli(["run", str(REPO / f"configs/{demo}.toml"), "-q", *extra], capsys)
    else:
        code, _, err = run_cli(["datagen", algorithm, f"{base}/demo/{config}", *args], capsys)
    assert code == 0, err
    code, out, err = run_cli(["run", str(REPO / f"configs/{config}.toml"), "--json", *extra], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["algorithm"] == algorithm and report["wall_seconds"] > 0
    # the estimate's stages are the run's, so "estimate vs actual per stage" compares like with like
    # (validate: a run's always, an estimate's when opening a sparse input reads its indptr)
    ran = [s["name"] for s in report["stages"] if s["name"] != "validate"]
    assert ran == [s["name"] for s in report["estimate"]["stages"] if s["name"] not in ("shutdown", "validate")]
    if algorithm in ("linreg", "tsqr", "mttkrp", "pca"):  # one pass (pca: exact, and the scores), no iterations to guess: every task planned
        planned = {s["name"]: s["tasks.count"] for s in report["estimate"]["stages"] if s["name"] != "shutdown"}
        assert {s["name"]: s["tasks"] for s in report["stages"] if s["name"] != "validate"} == planned
    name = CONFIG_NAME.get(config, config)
    group = read_result(f"{base}/results/{name}-demo", endpoint)
    assert set(group.array_keys()) == arrays
