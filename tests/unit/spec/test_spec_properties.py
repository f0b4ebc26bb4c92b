"""The error contract, by property: whatever spec tree and ``--set`` a user writes, ``plan``
succeeds (0) or fails with exit 2 and one line ``arrayjob: error: ...``, never a traceback."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from arrayjob.spec import SECTIONS
from tests.harness.helpers import run_cli

# real keys (so some examples get past the unknown-key check) and a few that are not
KEYS = ["name", "algorithm", "X", "y", "A", "uri", "solver", "l2", "max_iter", "tol", "k", "init", "seed",
        "fit_intercept", "tiling", "fusion", "placement", "address", "num_cpus", "endpoint_url", "zz"]
GOOD: dict[str, Any] = {
    "job": {"name": "t", "algorithm": "logreg"},
    "inputs": {"X": "data/X.zarr", "y": "data/y.zarr"},
    "params": {"solver": "lbfgs"},
    "output": {"uri": "out"},
}

keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=5))
scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["logreg", "kmeans", "pagerank", "lbfgs", "newton", "greedy", "data/X.zarr", "s3://b/x",
                     "gs://b", "${NO_SUCH_VAR}", "${HOME:-x}", "", "auto", "local"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(keys, inner, max_size=3)),
                      max_leaves=6)
sections = st.dictionaries(keys, values, max_size=4)
trees = st.dictionaries(st.sampled_from([*SECTIONS, "extra"]), st.one_of(sections, scalars), max_size=4)
overrides = st.lists(st.one_of(
    st.builds(lambda s, k, v: f"{s}.{k}={v}", st.sampled_from(SECTIONS), keys,
              st.one_of(st.text(max_size=10), st.integers(min_value=-(2**80), max_value=2**80).map(str))),
    st.text(max_size=15),
), max_size=2)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml(tree: dict[str, Any]) -> str:
    top = [f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in tree.items() if not isinstance(v, dict)]
    tables = [f"\n[{json.dumps(k)}]\n" + "".join(f"{json.dumps(key)} = {toml_value(v)}\n" for key, v in table.items())
              for k, table in tree.items() if isinstance(table, dict)]
    return "".join(top + tables)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=trees, start_good=st.booleans(), sets=overrides)
@example(tree={}, start_good=True, sets=["params.a\nb=1"])  # a key holding a newline
@example(tree={"params": {"x\ry": 1}}, start_good=True, sets=[])
@example(tree={}, start_good=True, sets=["params.max_iter=99999999999999999999999"])
def test_plan_keeps_the_error_contract(data, capsys, tree, start_good, sets):
    if start_good:  # merge into a valid spec, so examples also reach the later checks
        tree = {**GOOD, **{k: {**GOOD.get(k, {}), **v} if isinstance(v, dict) else v for k, v in tree.items()}}
    path = data / "spec.toml"
    path.write_text(toml(tree), encoding="utf-8", errors="surrogatepass")
    args = ["plan", str(path)]
    for text in sets:
        args += ["--set", text]
    code, _, err = run_cli(args, capsys)
    assert code in (0, 2), err
    assert "Traceback" not in err
    if code:
        assert err.startswith("arrayjob: error: ") and len(err.splitlines()) == 1 and err.endswith("\n"), err
    assert not (data / "out").exists()
    np.testing.assert_equal(code == 0, err == "")
