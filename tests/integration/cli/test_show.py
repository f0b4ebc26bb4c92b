"""`arrayjob show OUTPUT_URI`: the published run's summary from its report.json, on a local
directory and on the loopback S3 server; one line and a documented exit code when there is
nothing (readable) to show."""

from __future__ import annotations

import json

import pytest

from tests.harness.helpers import logreg_data, published, run_cli, write_array, write_spec


def _publish(base: str, storage: str, endpoint: str | None, workdir, capsys) -> str:
    """Run a small logreg with its output at ``<base>/out``; returns the output URI."""
    X, y = logreg_data(2000, 4, seed=5)
    write_array(f"{base}/X.zarr", X, (500, 4), endpoint=endpoint)
    write_array(f"{base}/y.zarr", y, (500,), endpoint=endpoint)
    spec = write_spec(workdir / "spec.toml", inputs={"X": f"{base}/X.zarr", "y": f"{base}/y.zarr"},
                      output=f"{base}/out", storage=storage)
    code, _, err = run_cli(["run", str(spec), "--quiet"], capsys)
    assert code == 0, err
    return f"{base}/out"


def _check_shown(output: str, endpoint: str | None, args: list[str], capsys) -> None:
    code, out, err = run_cli(["show", output, *args], capsys)
    assert code == 0 and err == "", err
    run_prefix = published(output, endpoint)
    code, raw, _ = run_cli(["show", output, "--json", *args], capsys)
    assert code == 0
    report = json.loads(raw)  # the report itself, as stored
    lines = out.splitlines()
    run_id = run_prefix.rsplit("/", 1)[1]
    assert lines[0].startswith(f"test-logreg: logreg, run {run_id}, published ")
    result = report["result"]
    assert lines[1] == (f"  result: objective {result['objective']:.4g}, iterations {result['iterations']}, "
                        f"evaluations {result['evaluations']}, "
                        f"evaluations per iteration {result['evaluations_per_iteration']:.4g}, "
                        f"converged {str(result['converged']).lower()}, "
                        f"gradient norm {result['gradient_norm']:.3e}, solver lbfgs, n samples 2,000, n features 4")
    assert lines[2].startswith(f"  wall {report['wall_seconds']:.2f} s: validate ")
    assert f"  files: {run_prefix}/result.zarr; report.json, report.html beside it" in lines
    assert any(line.startswith("  tasks.count=") for line in lines)
    # no `arrayjob calibrate` here: the summary says the estimate is uncalibrated and how to calibrate
    assert lines[-1].startswith("  estimate uncalibrated: made with the shipped profile") and "arrayjob calibrate" in lines[-1]
    assert report["estimate"]["profile"]["calibrated"] is False
    # the fit stopped before max_iter (100): the estimate for the iterations it ran is beside the first
    assert report["estimate"]["iterations"]["assumed"] == 100 and result["iterations"] < 100
    assert report["estimate_rescaled"]["iterations"]["assumed"] == result["iterations"]
    assert report["estimate_rescaled"]["tasks"]["count"] < report["estimate"]["tasks"]["count"]
    assert [s["name"] for s in report["stages"]] == ["validate", "connect", "load", "fit", "write"]
    starts = [s["start_seconds"] for s in report["stages"]]
    assert starts == sorted(starts) and all(
        s["start_seconds"] + s["wall_seconds"] <= n["start_seconds"] + 1e-3
        for s, n in zip(report["stages"], report["stages"][1:], strict=False))


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_show_local(workdir, capsys):
    output = _publish(str(workdir / "data"), "", None, workdir, capsys)
    _check_shown(output, None, [], capsys)


@pytest.mark.ray
@pytest.mark.s3
@pytest.mark.usefixtures("ray_session")
def test_show_s3(s3_endpoint, s3_bucket, workdir, capsys):
    output = _publish(f"s3://{s3_bucket}/data", f'endpoint_url = "{s3_endpoint}"', s3_endpoint, workdir, capsys)
    _check_shown(output, s3_endpoint, ["--endpoint-url", s3_endpoint], capsys)


@pytest.mark.s3
def test_show_s3_nothing_published(s3_endpoint, s3_bucket, capsys):
    code, out, err = run_cli(["show", f"s3://{s3_bucket}/none", "--endpoint-url", s3_endpoint], capsys)
    assert (code, out) == (2, "")
    assert err == (f"arrayjob: error: s3://{s3_bucket}/none: nothing published there "
                   "(no _SUCCESS; a run publishes it last)\n")
    code, _, err = run_cli(["show", "s3://no-such-bucket-here/x", "--endpoint-url", s3_endpoint], capsys)
    assert code == 2 and err.startswith("arrayjob: error: s3://no-such-bucket-here/x: nothing published there: "
                                        "the bucket 'no-such-bucket-here' does not exist")


def test_show_unreachable_endpoint_exit_4(capsys):
    code, out, err = run_cli(["show", "s3://bucket/x", "--endpoint-url", "http://127.0.0.1:9"], capsys)
    assert (code, out) == (4, "")
    assert err.startswith("arrayjob: error: s3://bucket/x: the S3 endpoint http://127.0.0.1:9 does not answer")
    assert err.count("\n") == 1


def test_show_local_errors(tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_cli(["show", str(out)], capsys)
    assert code == 2 and err == f"arrayjob: error: {out}: nothing published there (no _SUCCESS; a run publishes it last)\n"

    out.mkdir()
    (out / "_SUCCESS").write_text("{not json")
    code, _, err = run_cli(["show", str(out)], capsys)
    assert code == 2 and err == f"arrayjob: error: {out}/_SUCCESS: not a manifest arrayjob wrote (not a JSON object)\n"

    (out / "_SUCCESS").write_text(json.dumps({"run_id": "r1", "prefix": "runs/r1"}))
    code, _, err = run_cli(["show", str(out)], capsys)
    assert code == 2 and err == f"arrayjob: error: {out}: _SUCCESS names run r1, but runs/r1/report.json is missing\n"

    (out / "runs/r1").mkdir(parents=True)
    (out / "runs/r1/report.json").write_text("[1, 2]")
    code, _, err = run_cli(["show", str(out)], capsys)
    assert code == 2 and err == f"arrayjob: error: {out}/runs/r1/report.json: not a report arrayjob wrote (not a JSON object)\n"

