"""``arrayjob deploy``: cluster definitions sized from the plan, valid for Ray and KubeRay, with
no secret in them. The shipped examples in deploy/ pass the same checks."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
SHIPPED = {"ray-cluster": REPO / "deploy" / "ray-cluster.yaml", "kuberay": REPO / "deploy" / "kuberay" / "rayjob.yaml"}
SECRETS = re.compile(r"(?i)secret_access_key|session_token|password|AKIA[0-9A-Z]{16}|BEGIN [A-Z ]*PRIVATE KEY")
SENTINEL = "wJalrXUtnFEMI-not-a-real-key"


@pytest.fixture
def big_spec(workdir: Path) -> Path:
    """A logistic regression over 50,000,000 × 64 float64 (25.6 GB), metadata only: deploy reads no chunk."""
    import zarr

    for name, shape, chunks in (("X", (50_000_000, 64), (500_000, 64)), ("y", (50_000_000,), (500_000,))):
        zarr.create_array(str(workdir / f"data/{name}.zarr"), shape=shape, chunks=chunks, dtype="float64")
    spec = workdir / "big.toml"
    spec.write_text('[job]\nname = "big"\nalgorithm = "logreg"\n[inputs]\nX = "s3://b/X.zarr"\ny = "s3://b/y.zarr"\n'
                    '[params]\nmax_iter = 20\n[output]\nuri = "s3://b/out"\n')
    return spec


def deploy(*args: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from arrayjob.cli.main import main

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SENTINEL)  # whatever the environment holds stays out of the file
    code = main(["deploy", *args])
    out, err = capsys.readouterr()
    return code, out, err


def local_inputs(workdir: Path) -> list[str]:
    return ["--set", f"inputs.X={workdir}/data/X.zarr", "--set", f"inputs.y={workdir}/data/y.zarr"]


def instance(name: str):  # type: ignore[no-untyped-def]
    from arrayjob.costing.prices import load_prices

    return load_prices().instance(name)


def estimate(spec_path: Path, workdir: Path, instance_name: str, nodes: int):  # type: ignore[no-untyped-def]
    """The estimate deploy sizes from, made directly."""
    from arrayjob import runner
    from arrayjob.costing.estimate import estimate_job
    from arrayjob.costing.prices import load_prices
    from arrayjob.costing.profile import load_profile
    from arrayjob.spec import load_spec

    spec = load_spec(spec_path, local_inputs(workdir)[1::2])
    return estimate_job(runner.prepare(spec), spec, nodes=nodes, instance=instance(instance_name),
                        prices=load_prices(), profile=load_profile())


def ray_schema() -> dict[str, Any]:
    import ray.autoscaler

    return json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


def check_ray_cluster(text: str) -> dict[str, Any]:
    import jsonschema
    from ray.autoscaler._private.util import fillout_defaults, validate_config

    config = yaml.safe_load(text)
    jsonschema.validate(config, ray_schema())  # Ray's own schema, from the wheel
    validate_config(fillout_defaults(config))  # as `ray up` does: with Ray's AWS defaults merged in
    assert config["provider"]["type"] == "aws"
    for node_type in config["available_node_types"].values():
        assert "IamInstanceProfile" in node_type["node_config"]  # S3 by instance profile
    assert not SECRETS.search(text) and SENTINEL not in text
    return config


def check_rayjob(text: str) -> dict[str, Any]:
    from arrayjob.spec import validate

    documents = {d["kind"]: d for d in yaml.safe_load_all(text)}
    job = documents["RayJob"]
    assert job["apiVersion"] == "ray.io/v1" and job["metadata"]["name"]
    spec = job["spec"]
    assert spec["entrypoint"].startswith("arrayjob run ")
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] >= 0
    cluster = spec["rayClusterSpec"]
    assert cluster["enableInTreeAutoscaling"] is True
    head = cluster["headGroupSpec"]
    pods = [head["template"]["spec"]]
    for group in cluster["workerGroupSpecs"]:  # the fields KubeRay's CRD requires of a worker group
        assert group["groupName"] and isinstance(group["rayStartParams"], dict)
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        pods.append(group["template"]["spec"])
    assert isinstance(head["rayStartParams"], dict)
    account = documents["ServiceAccount"]
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    for pod in pods:
        assert pod["serviceAccountName"] == account["metadata"]["name"]  # S3 by the service account
        assert all(c["name"] and c["image"] for c in pod["containers"])
        assert not any("env" in c for c in pod["containers"])  # no credentials passed in
    # the entrypoint's spec is the ConfigMap mounted on the head, and it is a valid spec
    path = spec["entrypoint"].split()[-1]
    mount = next(m for m in head["template"]["spec"]["containers"][0]["volumeMounts"] if path.startswith(m["mountPath"]))
    volume = next(v for v in head["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    config_map = documents["ConfigMap"]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    import tomllib

    validate(tomllib.loads(config_map["data"][Path(path).name]))
    assert not SECRETS.search(text) and SENTINEL not in text
    return job


@pytest.mark.parametrize("target", ["ray-cluster", "kuberay"])
def test_the_shipped_examples_are_valid(target: str) -> None:
    text = SHIPPED[target].read_text()
    if target == "ray-cluster":
        config = check_ray_cluster(text)
        assert config["available_node_types"]["worker"]["min_workers"] == 4
    else:
        check_rayjob(text)
    assert "s3://your-bucket/" in text or target == "ray-cluster"


def test_ray_cluster_sized_by_nodes(big_spec: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    from arrayjob.cluster_definitions import object_store_bytes

    code, out, err = deploy(str(big_spec), "--target", "ray-cluster", "--nodes", "4", "--max-nodes", "6",
                            *local_inputs(workdir), monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    assert err.splitlines()[0] == ("arrayjob: warning: inputs.X, inputs.y: local paths; every node of the cluster "
                                   "must see them at the same place (s3:// needs nothing)")
    config = check_ray_cluster(out)
    worker = config["available_node_types"]["worker"]
    assert (worker["min_workers"], worker["max_workers"], config["max_workers"]) == (4, 6, 6)
    assert worker["node_config"]["InstanceType"] == "r5.2xlarge" and worker["resources"]["CPU"] == 8
    assert config["available_node_types"]["head"]["resources"] == {"CPU": 0}
    store = int(re.search(r"--object-store-memory=(\d+)", " ".join(config["worker_start_ray_commands"])).group(1))
    peak = max(estimate(big_spec, workdir, "r5.2xlarge", 4).peak_bytes_per_node)
    assert store == object_store_bytes(peak, instance("r5.2xlarge"))
    assert store >= peak / 0.8 and store >= 0.3 * 64 * 2**30 - 2**20  # the peak with headroom; Ray's default share


def test_the_default_count_is_the_fewest_that_hold_the_plan(big_spec: Path, workdir: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The count `estimate` chooses for a cluster that can grow (costing.sizing)."""
    from arrayjob.costing.estimate import MEMORY_HEADROOM
    from arrayjob.costing.sizing import usable_bytes

    code, out, err = deploy(str(big_spec), "--target", "kuberay", "--instance-type", "m5.xlarge",
                            *local_inputs(workdir), monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    group = check_rayjob(out)["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    chosen = group["minReplicas"]
    assert chosen > 1  # 25.6 GB does not fit one 16 GiB node
    assert "the smallest count whose object stores hold its peak" in err

    at = estimate(big_spec, workdir, "m5.xlarge", chosen)
    assert max(at.peak_bytes_per_node) <= usable_bytes(instance("m5.xlarge")) and at.resident_fraction == 1
    assert estimate(big_spec, workdir, "m5.xlarge", chosen - 1).resident_fraction < 1  # one fewer streams
    assert int(group["rayStartParams"]["object-store-memory"]) >= max(at.peak_bytes_per_node) / MEMORY_HEADROOM - 2**20


def test_a_deadline_picks_the_cheapest_count_that_meets_it(big_spec: Path, workdir: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    def wall(n: int) -> float:
        return estimate(big_spec, workdir, "r5.2xlarge", n).wall_seconds

    deadline = (wall(2) + wall(4)) / 2  # 3 nodes may or may not meet it; 4 do
    code, out, err = deploy(str(big_spec), "--target", "ray-cluster", "--deadline", f"{deadline:.3f}s",
                            *local_inputs(workdir), monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    chosen = check_ray_cluster(out)["available_node_types"]["worker"]["min_workers"]
    assert wall(chosen) <= deadline < wall(chosen - 1)
    assert "the cheapest count the estimate finishes within" in err

    code, out, err = deploy(str(big_spec), "--target", "ray-cluster", "--deadline", "1s", "--max-nodes", "64",
                            *local_inputs(workdir), monkeypatch=monkeypatch, capsys=capsys)
    assert code == 3 and out == ""
    assert err.splitlines()[-1].startswith("arrayjob: error: no node count up to 64 meets --deadline 1.00 s")


@pytest.mark.parametrize(("args", "message"), [
    (["--nodes", "2", "--deadline", "1h"], "--nodes, --deadline: give one of them, not both"),
    (["--instance-type", "local"], "--instance-type: 'local' is this machine"),
    (["--deadline", "soon"], "--deadline: expected a duration like 90s, 10m or 1.5h, got 'soon'"),
    (["--set", "params.l3=1"], "params.l3: unknown key"),
])
def test_bad_arguments_are_exit_2(big_spec: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out, err = deploy(str(big_spec), "--target", "kuberay", *local_inputs(workdir), *args,
                            monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and out == ""
    assert err.splitlines()[-1].startswith(f"arrayjob: error: {message}")
