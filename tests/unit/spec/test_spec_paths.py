"""Relative paths in a spec are relative to the spec file's directory, so a spec runs the
same from any working directory (cron starts jobs in $HOME); paths given with --set are
relative to the working directory."""

from __future__ import annotations

from pathlib import Path

from arrayjob.spec import load_spec
from tests.harness.helpers import (
    write_spec,
)

REPO = Path(__file__).resolve().parents[3]


def test_relative_paths_resolve_against_the_spec_directory(tmp_path, monkeypatch):
    specs = tmp_path / "project" / "specs"
    specs.mkdir(parents=True)
    spec = write_spec(specs / "job.toml", inputs={"X": "../data/X.zarr", "y": "file://../data/y.zarr"},
                      output="../out", algorithm="logreg")
    elsewhere = tmp_path / "home"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    job = load_spec(str(spec))
    project = tmp_path / "project"
    assert job.inputs["X"].path == str(project / "data" / "X.zarr")
    assert job.inputs["y"].path == str(project / "data" / "y.zarr")
    assert job.output.path == str(project / "out")
    # the spec's identity does not depend on where it was run from
    monkeypatch.chdir(project)
    assert load_spec("specs/job.toml").digest() == job.digest()


def test_set_paths_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "specs").mkdir()
    spec = write_spec(tmp_path / "specs" / "job.toml", inputs={"X": "X.zarr", "y": "y.zarr"}, output="out")
    monkeypatch.chdir(tmp_path)
    job = load_spec(str(spec), ["output.uri=here/out", "inputs.X=data/X.zarr"])
    assert job.output.path == str(tmp_path / "here" / "out")
    assert job.inputs["X"].path == str(tmp_path / "data" / "X.zarr")
    assert job.inputs["y"].path == str(tmp_path / "specs" / "y.zarr")  # still the spec's


def test_absolute_and_s3_paths_are_left_alone(tmp_path, monkeypatch):
    spec = write_spec(tmp_path / "job.toml", inputs={"X": "s3://bucket/X.zarr", "y": str(tmp_path / "abs" / "y.zarr")},
                      output="s3://bucket/out")
    monkeypatch.chdir("/")
    job = load_spec(str(spec))
    assert (job.inputs["X"].scheme, job.inputs["X"].path) == ("s3", "bucket/X.zarr")
    assert job.inputs["y"].path == str(tmp_path / "abs" / "y.zarr")


def test_kmeans_init_array_is_a_path_like_the_inputs(tmp_path, monkeypatch):
    (tmp_path / "specs").mkdir()
    spec = write_spec(tmp_path / "specs" / "k.toml", inputs={"X": "X.zarr"}, output="out", algorithm="kmeans",
                      params='k = 2\ninit = "../centroids.zarr"\n')
    monkeypatch.chdir("/")
    assert load_spec(str(spec)).params.init == str(tmp_path / "centroids.zarr")
    assert load_spec(str(spec), ['params.init="random"']).params.init == "random"


