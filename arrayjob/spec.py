"""The job spec: a TOML file, ``${VAR:-default}`` interpolation, ``--set`` overrides, validation.

Every problem is a ``SpecError`` whose message names the key (``params.l2``) and says
what was expected, so the CLI can print it as one line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sys
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arrayjob.errors import SpecError
from arrayjob.io.locations import (
    GLOB_CHARACTERS,
    Location,
    StorageOptions,
    TableSelection,
    parse_uri,
    split_glob,
)
from arrayjob.runtime.cluster import ClusterOptions

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SECTIONS = ("job", "inputs", "params", "output", "cluster", "storage", "planner", "run", "tracking")
_INT64 = (-(2**63), 2**63 - 1)
_MAX_FLOAT = int(sys.float_info.max)
SECRET_WORDS = ("secret", "token", "password", "key_id", "access_key", "credential")


def _strategy(kind: str, default: str) -> Any:
    """A ``[planner]`` key whose valid values are the strategies registered for ``kind``."""

    def names() -> tuple[str, ...]:
        from arrayjob.planner.pipeline import strategies

        return strategies(kind)

    return field(default=default, metadata={
        "check": lambda v: v in names(), "expect": lambda: "one of " + ", ".join(repr(n) for n in names())})


@dataclass(frozen=True)
class PlannerOptions:
    """The ``[planner]`` section: which strategy each planner pass uses."""

    tiling: str = _strategy("tiling", "greedy")
    fusion: str = _strategy("fusion", "cost")
    placement: str = _strategy("placement", "lshs")


@dataclass(frozen=True)
class RunOptions:
    """The ``[run]`` section: how a run goes, not what it computes (not in the spec digest)."""

    # seconds between checkpoints of an iterative job's state (at most one per iteration; 0: each)
    checkpoint_every: float = field(default=60.0, metadata={"check": lambda v: v >= 0 and v < float("inf"),
                                                             "expect": "a number of seconds >= 0"})


@dataclass(frozen=True)
class TrackingOptions:
    """The ``[tracking]`` section: where a run is recorded besides its report (not in the spec
    digest). Lineage has no key: it follows ``OPENLINEAGE_URL`` / ``OPENLINEAGE_CONFIG``."""

    # an MLflow tracking server (http://host:5000); else MLFLOW_TRACKING_URI; else no MLflow run
    mlflow: str | None = field(default=None, metadata={"check": lambda v: v != "", "expect": "a tracking URI"})
    # the MLflow experiment; else MLFLOW_EXPERIMENT_NAME, MLFLOW_EXPERIMENT_ID, else the job's name
    experiment: str | None = field(default=None, metadata={"check": lambda v: v != "", "expect": "a name"})


@dataclass(frozen=True)
class JobSpec:
    """A validated job spec. ``params`` is the algorithm's own params dataclass."""

    name: str
    algorithm: str
    inputs: Mapping[str, Location]
    params: Any
    output: Location
    cluster: ClusterOptions
    storage: StorageOptions
    planner: PlannerOptions
    source: str
    resolved: Mapping[str, Any] = field(repr=False)
    # per input: "error" (a missing chunk is lost data) or "fill" (read as the fill value)
    missing_chunks: Mapping[str, str] = field(default_factory=dict)
    # per input: "zarr", "parquet", or "" (told by what is at its URI)
    formats: Mapping[str, str] = field(default_factory=dict)
    # per input that is or may be Parquet: what of it to read
    tables: Mapping[str, TableSelection] = field(default_factory=dict)
    run: RunOptions = field(default_factory=RunOptions)
    tracking: TrackingOptions = field(default_factory=TrackingOptions)
    # ``[output] format``: "zarr" (result.zarr only), or "parquet": per-row outputs as tables
    output_format: str = "zarr"

    def digest(self) -> str:
        """What identifies the result: job, inputs, params and output (not where or how it ran)."""
        identity = {k: self.resolved.get(k, {}) for k in ("job", "inputs", "params", "output")}
        return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()

    def redacted(self) -> dict[str, Any]:
        """The resolved spec with anything that looks like a secret replaced."""
        return _redact(self.resolved)


def _within(inner: Location, outer: Location) -> bool:
    """Whether ``inner`` is ``outer`` or under it; local paths compared with links resolved."""
    if inner.scheme != outer.scheme:
        return False
    a, b = inner.path, outer.path
    if inner.scheme == "file":
        a, b = os.path.realpath(a), os.path.realpath(b)
    return a == b or a.startswith(b.rstrip("/") + "/")


def _redact(value: Any, key: str = "") -> Any:
    if isinstance(value, Mapping):
        return {k: _redact(v, k) for k, v in value.items()}
    if any(w in key.lower() for w in SECRET_WORDS):
        return "***"
    if isinstance(value, str):
        # credentials embedded in an endpoint URL: scheme://user:pass@host
        return re.sub(r"(://)[^/@\s]+:[^/@\s]+@", r"\1***@", value)
    return value


# -- reading ---------------------------------------------------------------------------------


def interpolate(value: Any, env: Mapping[str, str], key: str = "") -> Any:
    """Replace ``${VAR}`` and ``${VAR:-default}`` in every string of a parsed spec."""
    if isinstance(value, dict):
        return {k: interpolate(v, env, f"{key}.{k}" if key else k) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env, key) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if env.get(name):
            return env[name]
        if default is not None:
            return default
        raise SpecError(f"{key}: environment variable {name} is not set and has no default")

    return _VAR.sub(substitute, value)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``params.l2=0.01`` -> (["params", "l2"], 0.01); values are TOML, else plain strings."""
    path, sep, raw = text.partition("=")
    keys = path.strip().split(".")
    if not sep or not all(k.strip() for k in keys):
        raise SpecError(f"--set {text!r}: expected KEY=VALUE with a dotted key, e.g. params.l2=0.01")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except ValueError:  # not TOML (TOMLDecodeError), or an integer of over 4300 digits
        value = raw
    return [k.strip() for k in keys], value


def read_spec(path: str | Path, overrides: Sequence[str] = (), env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Parse the TOML file, apply ``--set`` overrides, then interpolate the environment."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: no such spec file") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a directory, expected a spec file (TOML)") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the spec: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: the spec is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    except ValueError as exc:  # an integer of over 4300 digits
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    for text in overrides:
        keys, value = parse_override(text)
        table = raw
        for i, k in enumerate(keys[:-1]):
            table = table.setdefault(k, {})
            if not isinstance(table, dict):
                raise SpecError(f"--set {text!r}: {'.'.join(keys[: i + 1])} is not a table")
        table[keys[-1]] = value
    return interpolate(raw, os.environ if env is None else env)


# -- validating ------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (bool, int, float, str, Literal, X | None)."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _coerce(value, option, key)
            except SpecError as exc:
                errors.append(exc)
        raise SpecError(f"{key}: expected {' or '.join(_type_name(o) for o in options)}, got {value!r}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise SpecError(f"{key}: expected {_type_name(tp)}, got {value!r}")
        return value
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }.get(tp)
    if ok is None:
        raise TypeError(f"unsupported spec field type {tp!r} for {key}")
    if not ok:
        raise SpecError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if tp is int and not _INT64[0] <= value <= _INT64[1]:
        # TOML integers are 64-bit; Python's parser (and a --set) accept any size
        raise SpecError(f"{key}: expected a 64-bit integer ({_INT64[0]} to {_INT64[1]}), got {value!r}")
    if tp is float and isinstance(value, int) and abs(value) > _MAX_FLOAT:
        raise SpecError(f"{key}: expected a number a float64 can hold, got {value!r}")
    return float(value) if tp is float else value


def table_to_dataclass(cls: type, table: Any, section: str) -> Any:
    """Build the dataclass ``cls`` from a TOML table, naming ``section.key`` in every error.

    A field's metadata may hold ``check`` (a predicate) and ``expect`` (what it wants, in words).
    """
    if not isinstance(table, dict):
        raise SpecError(f"{section}: expected a table, got {table!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise SpecError(f"{section}.{unknown[0]}: unknown key (expected one of: {', '.join(fields)})")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, f in fields.items():
        key = f"{section}.{name}"
        if name not in table:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SpecError(f"{key}: required key is missing")
            continue
        value = _coerce(table[name], hints[name], key)
        check = f.metadata.get("check")
        if check is not None and value is not None and not check(value):
            expect = f.metadata.get("expect", "a valid value")
            raise SpecError(f"{key}: expected {expect() if callable(expect) else expect}, got {table[name]!r}")
        values[name] = value
    return cls(**values)


MISSING_CHUNKS = typing.Literal["error", "fill"]
FORMATS = typing.Literal["zarr", "parquet"]
NULLS = typing.Literal["error", "zero"]
_TABLE_KEYS = ("columns", "column", "nulls", "id_column")
OUTPUT_FORMATS = typing.Literal["zarr", "parquet"]


@dataclass(frozen=True)
class InputEntry:
    """One ``[inputs]`` entry: a URI string, or a table with ``uri`` and the keys of its format."""

    uri: str
    format: str = ""  # "zarr", "parquet", or "" (told by what is at the URI)
    missing_chunks: str = "error"
    table: TableSelection = TableSelection()

    @classmethod
    def parse(cls, value: Any, key: str) -> InputEntry:
        """``"uri"``; ``{ uri, missing_chunks }`` (Zarr); ``{ uri, format = "parquet", columns =
        [...] | "f*", column, nulls }``. The format is Parquet where the entry says so, names
        columns, or its URI ends in ``.parquet`` or holds a glob."""
        if not isinstance(value, dict):
            uri = _coerce(value, str, key)
            return cls(uri, _format_of(uri))
        expected = ("uri", "format", "missing_chunks", *_TABLE_KEYS)
        if unknown := sorted(set(value) - set(expected)):
            raise SpecError(f"{key}.{unknown[0]}: unknown key (expected one of: {', '.join(expected)})")
        if "uri" not in value:
            raise SpecError(f"{key}.uri: required key is missing")
        uri = _coerce(value["uri"], str, f"{key}.uri")
        table_keys = [k for k in _TABLE_KEYS if k in value]
        fmt = _coerce(value["format"], FORMATS, f"{key}.format") if "format" in value else \
            "parquet" if table_keys else _format_of(uri)
        if fmt == "zarr" and table_keys:
            raise SpecError(f"{key}.{table_keys[0]}: a key of Parquet inputs, but {key}.format is \"zarr\"")
        if fmt == "parquet" and "missing_chunks" in value:
            raise SpecError(f"{key}.missing_chunks: a key of Zarr inputs; a Parquet input has no chunks "
                            "(nulls = \"zero\" reads its nulls as 0)")
        missing = _coerce(value.get("missing_chunks", "error"), MISSING_CHUNKS, f"{key}.missing_chunks")
        return cls(uri, fmt, missing, _table_selection(value, key) if fmt != "zarr" else TableSelection())


def _format_of(uri: str) -> str:
    return "parquet" if uri.rstrip("/").endswith(".parquet") or any(c in uri for c in GLOB_CHARACTERS) else ""


def _table_selection(value: dict[str, Any], key: str) -> TableSelection:
    """``columns`` (names, or one string: a glob, or a name), ``column`` or neither; ``nulls``."""
    columns, column = value.get("columns"), value.get("column")
    nulls = _coerce(value.get("nulls", "error"), NULLS, f"{key}.nulls")
    ids = value.get("id_column")
    if ids is not None and (not isinstance(ids, str) or not ids):
        raise SpecError(f"{key}.id_column: expected a column name, got {ids!r}")
    if column is not None:
        if columns is not None:
            raise SpecError(f"{key}.column: give columns (a matrix) or column (a vector), not both")
        if not isinstance(column, str) or not column:
            raise SpecError(f"{key}.column: expected a column name, got {column!r}")
        return TableSelection(column=column, nulls=nulls, id_column=ids)
    if isinstance(columns, str) and any(c in columns for c in GLOB_CHARACTERS):
        return TableSelection(glob=columns, nulls=nulls, id_column=ids)
    names = (columns,) if isinstance(columns, str) else columns if columns is not None else []
    if not isinstance(names, list | tuple) or (columns is not None and not names) or \
            not all(isinstance(c, str) and c for c in names):
        raise SpecError(f"{key}.columns: expected a list of column names or a glob such as \"f*\", got {columns!r}")
    if twice := next((c for i, c in enumerate(names) if c in names[:i]), None):
        raise SpecError(f"{key}.columns: {twice!r} is named twice")
    return TableSelection(columns=tuple(names), nulls=nulls, id_column=ids)


def validate(raw: dict[str, Any], source: str = "<spec>", *, base: str | None = None,
             from_command_line: frozenset[str] = frozenset()) -> JobSpec:
    """Check the whole spec, before anything runs.

    A relative local path in it (an input, the output, a param naming an array) is relative
    to ``base``, the spec file's directory, unless its key (``inputs.X``, ``output.uri``)
    was given on the command line (``from_command_line``): then to the working directory.
    """
    from arrayjob.catalog import get_job, job_names

    def where(key: str) -> str | None:
        return None if key in from_command_line or key.rsplit(".", 1)[0] in from_command_line else base

    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise SpecError(f"{unknown[0]}: unknown section (expected: {', '.join(SECTIONS)})")
    job = raw.get("job")
    if not isinstance(job, dict):
        raise SpecError("job: missing [job] table with name and algorithm")
    bad = sorted(set(job) - {"name", "algorithm"})
    if bad:
        raise SpecError(f"job.{bad[0]}: unknown key (expected one of: name, algorithm)")
    name = _coerce(job.get("name", ""), str, "job.name")
    if not _NAME.match(name):
        raise SpecError(f"job.name: expected 1-128 letters, digits, '.', '_' or '-', got {name!r}")
    if "algorithm" not in job:
        raise SpecError(f"job.algorithm: required key is missing (one of: {', '.join(job_names())})")
    algorithm = _coerce(job["algorithm"], str, "job.algorithm")
    job_class = get_job(algorithm)

    inputs_table = raw.get("inputs", {})
    if not isinstance(inputs_table, dict):
        raise SpecError(f"inputs: expected a table, got {inputs_table!r}")
    for extra in sorted(set(inputs_table) - set(job_class.inputs)):
        raise SpecError(f"inputs.{extra}: unknown input for {algorithm} (expected: {', '.join(job_class.inputs)})")
    inputs = {}
    entries: dict[str, InputEntry] = {}
    for input_name in job_class.inputs:
        if input_name not in inputs_table:
            if input_name in job_class.optional_inputs:
                continue
            raise SpecError(f"inputs.{input_name}: required input of {algorithm} is missing")
        entry = entries[input_name] = InputEntry.parse(inputs_table[input_name], f"inputs.{input_name}")
        inputs[input_name] = parse_uri(entry.uri, key=f"inputs.{input_name}", base=where(f"inputs.{input_name}.uri"))

    params = table_to_dataclass(job_class.Params, raw.get("params", {}), "params")
    for f in dataclasses.fields(params):  # params naming an array: a path, resolved as the inputs are
        words = f.metadata.get("uri")
        text = getattr(params, f.name)
        if words is not None and text not in words and "://" not in text and not os.path.isabs(text):
            params = dataclasses.replace(params, **{f.name: str(parse_uri(text, key=f"params.{f.name}",
                                                                          base=where(f"params.{f.name}")))})
    output_table = raw.get("output")
    if not isinstance(output_table, dict) or "uri" not in output_table:
        raise SpecError("output.uri: required key is missing")
    if set(output_table) - {"uri", "format"}:
        raise SpecError(f"output.{sorted(set(output_table) - {'uri', 'format'})[0]}: unknown key "
                        "(expected one of: uri, format)")
    output = parse_uri(_coerce(output_table["uri"], str, "output.uri"), key="output.uri", base=where("output.uri"))
    output_format = _coerce(output_table.get("format", "zarr"), OUTPUT_FORMATS, "output.format")
    check_row_outputs(job_class, output_format, entries)
    for input_name, location in inputs.items():
        location = split_glob(location)[0]  # a glob's files lie under its directory
        if _within(location, output):
            raise SpecError(f"output.uri: {output} would overwrite inputs.{input_name}")
        if _within(output, location):
            raise SpecError(f"output.uri: {output} lies inside inputs.{input_name} ({location}); "
                            "the result would be written into an input")

    cluster = table_to_dataclass(ClusterOptions, raw.get("cluster", {}), "cluster")
    if cluster.max_nodes is not None and cluster.min_nodes > cluster.max_nodes:
        raise SpecError(f"cluster.min_nodes: expected at most cluster.max_nodes ({cluster.max_nodes}), "
                        f"got {cluster.min_nodes}")
    storage = table_to_dataclass(StorageOptions, raw.get("storage", {}), "storage")
    planner = table_to_dataclass(PlannerOptions, raw.get("planner", {}), "planner")
    run = table_to_dataclass(RunOptions, raw.get("run", {}), "run")
    tracking = table_to_dataclass(TrackingOptions, raw.get("tracking", {}), "tracking")
    return JobSpec(
        name=name,
        algorithm=algorithm,
        inputs=inputs,
        params=params,
        output=output,
        cluster=cluster,
        storage=storage,
        planner=planner,
        source=source,
        resolved=raw,
        missing_chunks={n: e.missing_chunks for n, e in entries.items()},
        formats={n: e.format for n, e in entries.items()},
        tables={n: e.table for n, e in entries.items() if e.format != "zarr"},
        run=run,
        tracking=tracking,
        output_format=output_format,
    )


def check_row_outputs(job_class: Any, output_format: str, entries: Mapping[str, InputEntry]) -> None:
    """A Parquet output needs a job with per-row outputs (``Job.row_input``); an id column is
    carried into one, from the input those rows follow, and nowhere else."""
    follows = job_class.row_input
    if output_format == "parquet" and follows is None:
        raise SpecError(f"output.format: {job_class.name} writes no per-row outputs to write as Parquet "
                        "(format = \"parquet\" is for kmeans labels, gmm labels, pca scores and predict's scores)")
    for name, entry in entries.items():
        if entry.table.id_column is None:
            continue
        if name != follows:
            raise SpecError(f"inputs.{name}.id_column: {job_class.name} writes no rows that follow inputs.{name}"
                            + (f" (its per-row outputs follow inputs.{follows})" if follows else ""))
        if output_format != "parquet":
            raise SpecError(f"inputs.{name}.id_column: ids are written only into a Parquet output; "
                            "add format = \"parquet\" to [output]")


def load_spec(path: str | Path, overrides: Sequence[str] = (), env: Mapping[str, str] | None = None) -> JobSpec:
    """Read and validate a spec file. Relative paths written in it are relative to its own
    directory, so a spec runs the same from any working directory (cron starts in $HOME);
    those given with ``--set`` are relative to the working directory, as a shell user means."""
    given = frozenset(".".join(parse_override(text)[0]) for text in overrides)
    return validate(read_spec(path, overrides, env), source=str(path),
                    base=os.path.dirname(os.path.abspath(path)), from_command_line=given)
