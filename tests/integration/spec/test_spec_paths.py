"""The integration tests of ``tests.unit.spec.test_spec_paths``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import shutil

import pytest

from tests.harness.helpers import (
    logreg_data,
    published,
    run_cli,
    without_progress,
    write_array,
)
from tests.unit.spec.test_spec_paths import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    REPO,
)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_shipped_config_runs_from_any_directory(tmp_path, monkeypatch, capsys):
    """configs/logreg.toml, unchanged, in a checkout's layout, run from an unrelated directory
    with no ARRAYJOB_BUCKET: it finds the demo data beside the configs, as `make demo` writes it."""
    checkout = tmp_path / "checkout"
    (checkout / "configs").mkdir(parents=True)
    shutil.copy(REPO / "configs" / "logreg.toml", checkout / "configs" / "logreg.toml")
    X, y = logreg_data(1000, 3)
    write_array(str(checkout / ".arrayjob/bucket/demo/logreg/X.zarr"), X, (250, 3))
    write_array(str(checkout / ".arrayjob/bucket/demo/logreg/y.zarr"), y, (250,))
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.chdir(home)
    monkeypatch.delenv("ARRAYJOB_BUCKET", raising=False)
    code, out, err = run_cli(["run", str(checkout / "configs" / "logreg.toml"), "--quiet"], capsys)
    assert code == 0 and without_progress(err) == "", err
    run_prefix = published(str(checkout / ".arrayjob/bucket/results/logreg-demo"))
    assert f"result {run_prefix}/result.zarr" in out
    assert list(home.iterdir()) == []  # nothing written where it was started
