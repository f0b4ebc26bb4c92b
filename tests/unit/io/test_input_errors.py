"""An input that is not an array is refused with a typed error, so callers decide by class."""

from __future__ import annotations

import pytest
import zarr

from arrayjob.errors import ArrayNotFound, GroupNotArray, InputError
from arrayjob.io.arrays import open_array_info
from arrayjob.io.locations import StorageOptions, parse_uri


def test_missing_array_is_array_not_found(tmp_path):
    with pytest.raises(ArrayNotFound, match=r"^inputs.X: no Zarr array at ") as raised:
        open_array_info("X", parse_uri(str(tmp_path / "none.zarr")), StorageOptions())
    assert isinstance(raised.value, InputError) and raised.value.exit_code == 2


def test_group_is_group_not_array(tmp_path):
    zarr.open_group(str(tmp_path / "grp.zarr"), mode="w")
    with pytest.raises(GroupNotArray, match="is a Zarr group, expected an array") as raised:
        open_array_info("X", parse_uri(str(tmp_path / "grp.zarr")), StorageOptions())
    assert isinstance(raised.value, InputError) and raised.value.exit_code == 2


def test_model_without_the_array_names_the_model(tmp_path):
    from arrayjob.io.model import PublishedModel

    zarr.open_group(str(tmp_path / "out" / "result.zarr"), mode="w")
    model = PublishedModel(name="model", key="inputs.model", location=parse_uri(str(tmp_path / "out")),
                           run_id="r1", result=parse_uri(str(tmp_path / "out" / "result.zarr")),
                           algorithm="logreg")
    with pytest.raises(InputError, match=r"^inputs.model: the logreg model of run r1 at .* has no array 'coef'$"):
        model.array("coef")
