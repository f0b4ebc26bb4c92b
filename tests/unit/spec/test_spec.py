"""Spec validation: every malformed spec gets its one exact line, exit code 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from arrayjob.spec import interpolate, load_spec, parse_override
from tests.harness.helpers import run_cli, write_array

GOOD = """\
[job]
name = "t"
algorithm = "logreg"

[inputs]
X = "data/X.zarr"
y = "data/y.zarr"

[params]
solver = "lbfgs"
l2 = 1e-4

[output]
uri = "out"
"""


def _spec(workdir: Path, text: str) -> str:
    path = workdir / "spec.toml"
    path.write_text(text)
    return str(path)


MALFORMED = [
    # (name, spec text or edit, extra CLI args, expected error after "arrayjob: error: ")
    ("not toml", "[job\nname = 1", [],
     "{spec}: not valid TOML: Expected ']' at the end of a table declaration (at line 1, column 5)"),
    ("unknown section", GOOD + "\n[paramz]\nl2 = 1\n", [],
     "paramz: unknown section (expected: job, inputs, params, output, cluster, storage, planner, run, tracking)"),
    ("unknown param", GOOD.replace("l2 = 1e-4", "l3 = 1e-4"), [],
     "params.l3: unknown key (expected one of: solver, family, classes, l2, l1, class_weight, fit_intercept, max_iter, "
     "tol)"),
    ("wrong type", GOOD.replace("l2 = 1e-4", 'l2 = "abc"'), [],
     "params.l2: expected a number, got 'abc'"),
    ("negative l2", GOOD.replace("l2 = 1e-4", "l2 = -1.0"), [],
     "params.l2: expected a number >= 0, got -1.0"),
    ("bool is not an int", GOOD.replace("l2 = 1e-4", "max_iter = true"), [],
     "params.max_iter: expected an integer, got True"),
    ("zero max_iter", GOOD.replace("l2 = 1e-4", "max_iter = 0"), [],
     "params.max_iter: expected an integer >= 1, got 0"),
    ("unknown solver", GOOD.replace('"lbfgs"', '"sgd"'), [],
     "params.solver: expected one of 'lbfgs', 'newton', got 'sgd'"),
    ("unknown algorithm", GOOD.replace('"logreg"', '"svm"'), [],
     "job.algorithm: unknown algorithm 'svm' (expected one of: als, cp_als, gmm, kmeans, linreg, logreg, mttkrp, pagerank, "
     "pca, predict, tsqr, or a job class as \"module:Class\")"),
    ("bad job name", GOOD.replace('name = "t"', 'name = "my job"'), [],
     "job.name: expected 1-128 letters, digits, '.', '_' or '-', got 'my job'"),
    ("missing input", GOOD.replace('y = "data/y.zarr"\n', ""), [],
     "inputs.y: required input of logreg is missing"),
    ("unknown input", GOOD.replace('y = "data/y.zarr"', 'y = "data/y.zarr"\nZ = "z"'), [],
     "inputs.Z: unknown input for logreg (expected: X, y, weights)"),
    ("missing output", GOOD.replace('[output]\nuri = "out"\n', ""), [],
     "output.uri: required key is missing"),
    ("unsupported scheme", GOOD.replace('uri = "out"', 'uri = "gs://b/out"'), [],
     "output.uri: unsupported URI scheme 'gs' in 'gs://b/out' (expected s3:// or file://)"),
    ("output over an input", GOOD.replace('uri = "out"', 'uri = "data"'), [],
     "output.uri: {cwd}/data would overwrite inputs.X"),
    ("unset variable", GOOD.replace('"out"', '"${NO_SUCH_VAR_X}/out"'), [],
     "output.uri: environment variable NO_SUCH_VAR_X is not set and has no default"),
    ("bad --set", GOOD, ["--set", "params.l2"],
     "--set 'params.l2': expected KEY=VALUE with a dotted key, e.g. params.l2=0.01"),
    ("--set a wrong value", GOOD, ["--set", "params.tol=0"],
     "params.tol: expected a number > 0, got 0"),
    ("--set an integer over 64 bits", GOOD, ["--set", "params.max_iter=99999999999999999999999"],
     "params.max_iter: expected a 64-bit integer (-9223372036854775808 to 9223372036854775807), "
     "got 99999999999999999999999"),
    ("an integer over 64 bits in the file", GOOD.replace("l2 = 1e-4", "max_iter = -99999999999999999999999"), [],
     "params.max_iter: expected a 64-bit integer (-9223372036854775808 to 9223372036854775807), "
     "got -99999999999999999999999"),
    ("--set a number no float holds", GOOD, ["--set", "params.l2=1" + "0" * 400],
     "params.l2: expected a number a float64 can hold, got 1" + "0" * 400),
    ("an integer too long to parse", GOOD.replace("l2 = 1e-4", "max_iter = 1" + "0" * 5000), [],
     "{spec}: not valid TOML: Exceeds the limit (4300 digits) for integer string conversion: value has 5001 digits; "
     "use sys.set_int_max_str_digits() to increase the limit"),
    ("cluster typo", GOOD + '\n[cluster]\nadress = "auto"\n', [],
     "cluster.adress: unknown key (expected one of: address, num_cpus, min_nodes, max_nodes, node_type, scale_timeout, "
     "node_startup, memory_budget, object_store_memory)"),
    ("a budget that is no size", GOOD, ["--set", "cluster.memory_budget=lots"],
     'cluster.memory_budget: expected a size such as "600MB", or a fraction of the object store (0.5 or "50%"), '
     "got 'lots'"),
    ("a budget fraction over 1", GOOD, ["--set", "cluster.memory_budget=1.5"],
     'cluster.memory_budget: expected a size such as "600MB", or a fraction of the object store (0.5 or "50%"), '
     "got 1.5"),
    ("an object store of no size", GOOD, ["--set", "cluster.object_store_memory=-1"],
     'cluster.object_store_memory: expected a size such as "600MB" or a number of bytes, got -1'),
    ("missing array", GOOD.replace("data/X.zarr", "nodata/X.zarr"), [],
     "inputs.X: no Zarr array at {cwd}/nodata/X.zarr (demo data: arrayjob datagen logreg {cwd}/nodata)"),
    ("a group, not an array", GOOD.replace('X = "data/X.zarr"', 'X = "grp.zarr"'), [],
     "inputs.X: {cwd}/grp.zarr is a Zarr group, expected an array"),
    ("mismatched rows", GOOD.replace("data/y.zarr", "short_y.zarr"), [],
     "inputs.y: expected shape (200,) to match the rows of inputs.X (200, 3), got (199,)"),
    ("1-D X", GOOD.replace("data/X.zarr", "data/y.zarr"), [],
     "inputs.X: expected a 2-D array (rows × features), got shape (200,)"),
    ("no spec file", None, [], "{cwd}/missing.toml: no such spec file"),
]


@pytest.mark.parametrize("name,text,args,expected", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_spec_one_line_exit_2_nothing_written(data, capsys, name, text, args, expected):
    import zarr

    zarr.open_group("grp.zarr", mode="w")
    write_array("short_y.zarr", np.zeros(199), (50,))
    spec = _spec(data, text) if text is not None else str(data / "missing.toml")
    code, out, err = run_cli(["run", spec, *args], capsys)
    assert code == 2
    assert out == ""
    assert err == "arrayjob: error: " + expected.format(spec=spec, cwd=data) + "\n"
    assert not (data / "out").exists()


def test_debug_shows_traceback(data, capsys):
    code, _, err = run_cli(["run", _spec(data, GOOD.replace('"lbfgs"', '"sgd"')), "--debug"], capsys)
    assert code == 2
    assert "Traceback" in err and err.rstrip().endswith("got 'sgd'")


def test_interpolation_defaults_and_environment():
    env = {"BUCKET": "s3://b", "EMPTY": ""}
    assert interpolate("${BUCKET:-x}/a", env) == "s3://b/a"
    assert interpolate("${EMPTY:-.local}/a", env) == ".local/a"
    assert interpolate("${MISSING:-d}/${BUCKET}", env) == "d/s3://b"
    assert interpolate({"t": ["${BUCKET}"], "n": 3}, env) == {"t": ["s3://b"], "n": 3}


def test_overrides_are_toml_values_or_strings():
    assert parse_override("params.l2=0.01") == (["params", "l2"], 0.01)
    assert parse_override("params.fit_intercept=false") == (["params", "fit_intercept"], False)
    assert parse_override("output.uri=s3://bucket/x") == (["output", "uri"], "s3://bucket/x")
    assert parse_override("params.solver=newton") == (["params", "solver"], "newton")


def test_resolved_spec_redacts_secrets(data, monkeypatch):
    spec = _spec(data, GOOD + '\n[storage]\nendpoint_url = "http://user:hunter2@127.0.0.1:9"\n')
    resolved = load_spec(spec).redacted()
    assert "hunter2" not in str(resolved)
    assert resolved["storage"]["endpoint_url"] == "http://***@127.0.0.1:9"


def test_digest_ignores_where_it_runs(data):
    spec = _spec(data, GOOD)
    a = load_spec(spec)
    b = load_spec(spec, ["cluster.address=auto"])
    c = load_spec(spec, ["params.l2=0.5"])
    assert a.digest() == b.digest() != c.digest()


def test_memory_budget_and_object_store(data):
    spec = _spec(data, GOOD)
    assert load_spec(spec).cluster.budget_bytes(10**9) == 800_000_000  # 80 % of the store by default
    budgets = {"600MB": 600_000_000, '"1.5 GiB"': 1_610_612_736, "0.4": 400_000_000, '"40%"': 400_000_000,
               "123456": 123_456}
    for text, expected in budgets.items():
        assert load_spec(spec, [f"cluster.memory_budget={text}"]).cluster.budget_bytes(10**9) == expected
    cluster = load_spec(spec, ["cluster.object_store_memory=600MB"]).cluster
    assert cluster.store_bytes == 600_000_000 and cluster.budget_bytes(cluster.store_bytes) == 480_000_000
    assert load_spec(spec).digest() == load_spec(spec, ["cluster.memory_budget=0.4"]).digest()


@pytest.mark.parametrize("command", ["run", "plan", "estimate"])
def test_directory_as_spec_is_one_line_exit_2(data, capsys, command):
    (data / "specs").mkdir()
    code, out, err = run_cli([command, str(data / "specs")], capsys)
    assert (code, out) == (2, "")
    assert err == f"arrayjob: error: {data / 'specs'}: is a directory, expected a spec file (TOML)\n"


@pytest.mark.parametrize(("args", "line"), [
    (["estimate", "job.toml", "--deadline", "soon"],
     "arrayjob: error: --deadline: expected a duration like 90s, 10m or 1.5h, got 'soon'"),
    (["run", "job.toml", "--nodes", "0"], "arrayjob: error: --nodes: 0 is not in the range x>=1."),
    (["estimate", "job.toml", "--nods", "3"], "arrayjob: error: No such option '--nods'. Did you mean '--nodes'?"),
    (["run"], "arrayjob: error: Missing argument 'SPEC'."),
    (["deploy", "job.toml", "--target", "x"], "arrayjob: error: --target: 'x' is not one of 'ray-cluster', 'kuberay'."),
])
def test_a_bad_option_is_one_line_exit_2(args, line, capsys):
    """Click's own usage errors follow the error contract too: one line, exit 2, no usage block."""
    code, out, err = run_cli(args, capsys)
    assert (code, out, err) == (2, "", line + "\n")
