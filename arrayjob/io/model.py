"""A published arrayjob output read as a model: what ``predict`` scores with and ``export`` writes.

A model is named by the URI of a job's output (its ``output.uri``) and read as every reader
reads a published output (``io.output``): ``_SUCCESS``, then the run it names. From that run,
``report.json`` gives the algorithm and the parameters the model was fitted with (the run's
resolved spec: never the user's word), and ``result.zarr`` its fitted arrays and attributes::

    model = open_model("model", parse_uri("s3://bucket/results/logreg-demo"), StorageOptions())
    model.algorithm, model.params          # "logreg", {"l2": 0.0001, ...} as its spec set them
    coef = read_whole(model.array("coef"), StorageOptions())

Opening reads the manifest, the report and the result group's attributes: metadata, as a
Zarr array's ``zarr.json`` is (not counted as data). ``array`` reads an array's metadata only;
its values are read by the caller, whole (a model's arrays are small: coefficients,
centroids), counted where it reads them. The model is pinned to the run ``_SUCCESS`` named
when it was opened: if the output is replaced meanwhile, that run's files are removed and a
later read of them fails (exit 2) instead of mixing two fits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from arrayjob.errors import ArrayNotFound, InputError, StorageError
from arrayjob.io.arrays import open_array_info, read_group_attrs
from arrayjob.io.locations import ArrayInfo, Location, StorageOptions
from arrayjob.io.output import read_published_report


@dataclass(frozen=True)
class PublishedModel:
    """The model an arrayjob run published at ``location``: which run, what it fitted and how."""

    name: str  # the input it is: "<name>.<array>" its arrays' names
    key: str  # how errors name it: "inputs.<name>" (a job's input), "MODEL_URI" (a command's)
    location: Location  # the output URI the user gave
    run_id: str  # the run ``_SUCCESS`` named when the model was opened
    result: Location  # that run's result.zarr
    algorithm: str
    params: Mapping[str, Any] = field(default_factory=dict)  # as its spec set them (defaults left out)
    attrs: Mapping[str, Any] = field(default_factory=dict)  # result.zarr's attributes (fit metrics)
    options: StorageOptions = field(default_factory=StorageOptions, repr=False, compare=False)

    def array(self, member: str) -> ArrayInfo:
        """The metadata of the fitted array ``member`` (e.g. "coef"), named ``<name>.<member>``;
        ``InputError`` naming the model if it has no such array."""
        try:
            return open_array_info(f"{self.name}.{member}", self.result.join(member), self.options)
        except ArrayNotFound:
            raise InputError(f"{self.key}: the {self.algorithm} model of run {self.run_id} at "
                             f"{self.location} has no array {member!r}") from None

    def describe(self) -> str:
        return f"the {self.algorithm} model of run {self.run_id} at {self.location}"


def open_model(name: str, location: Location, options: StorageOptions, *, key: str | None = None) -> PublishedModel:
    """Open the model published at ``location`` (``key``, by default ``inputs.<name>``, in
    errors): the run its ``_SUCCESS`` names, that run's algorithm and parameters, its result's
    attributes.

    Nothing published there, or a report that names no algorithm: ``InputError`` (exit 2);
    storage that refuses or does not answer: ``StorageError`` (exit 4)."""
    key = key or f"inputs.{name}"
    try:
        manifest, report = read_published_report(location, options)
    except (InputError, StorageError) as exc:
        raise type(exc)(f"{key}: {exc}") from None
    spec = report.get("spec")
    algorithm = report.get("algorithm")
    if not isinstance(spec, dict) or not isinstance(algorithm, str):
        raise InputError(f"{key}: {location}: the published report names no algorithm and spec "
                         "(not a result arrayjob published)")
    params = spec.get("params", {})
    prefix = str(manifest.get("prefix", ""))
    result = (location.join(prefix) if prefix else location).join("result.zarr")
    try:
        attrs = read_group_attrs(result, options)
    except InputError as exc:
        raise InputError(f"{key}: {exc}") from None
    return PublishedModel(name, key, location, str(manifest.get("run_id", "?")), result, algorithm,
                          dict(params) if isinstance(params, dict) else {}, attrs, options)
