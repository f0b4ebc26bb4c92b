"""The integration tests of ``tests.unit.algorithms.test_als_table``: what needs a real Ray or the loopback S3 server."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tests.harness.helpers import published, run_cli, write_parquet, write_spec
from tests.unit.algorithms.test_als_table import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    DRIVER,
    WORKERS,
    as_table,
    bad_table,
    full_ratings,
    opened_table,
)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_from_the_cli_a_repeat_is_exit_2_and_nothing_is_published(workdir, capsys):
    table, _ = bad_table("")
    table = pa.concat_tables([table, table.slice(3, 1)])
    write_parquet(str(workdir / "ratings"), [table], row_group_size=10)
    spec = write_spec(workdir / "als.toml", algorithm="als", params="rank = 2\nmax_iter = 2",
                      inputs={"R": {"uri": str(workdir / "ratings"), "columns": ["user", "item", "rating"]}},
                      output=str(workdir / "out"))
    code, _, err = run_cli(["run", str(spec)], capsys)
    errors = [line for line in err.splitlines() if line.startswith("arrayjob: error:")]
    assert code == 2 and len(errors) == 1 and "more than once" in errors[0] and "Traceback" not in err, err
    assert not (workdir / "out" / "_SUCCESS").exists()
    with pytest.raises(Exception):  # noqa: B017 - nothing published to read
        published(str(workdir / "out"))
