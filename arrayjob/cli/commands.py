"""The ``arrayjob`` commands (``cli.main`` is the process that runs them)."""

from __future__ import annotations

import contextlib
import json
import os
import sys

import click

from arrayjob import __version__
from arrayjob.cli.deploy import deploy
from arrayjob.cli.options import deadline_option, debug_option, set_option
from arrayjob.cli.remote import logs, status, stop, submit


def _planner_overrides(tiling: str | None, fusion: str | None, placement: str | None) -> list[str]:
    chosen = {"tiling": tiling, "fusion": fusion, "placement": placement}
    return [f"planner.{k}={json.dumps(v)}" for k, v in chosen.items() if v]


class PlannerChoice(click.Choice):
    """Choices the planner declares (a pass's registered strategies, the pass names), read
    when first needed: printing ``--help`` does not import the planner."""

    def __init__(self, kind: str) -> None:
        self.kind = kind  # a strategy kind, or "pass"
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:  # type: ignore[override]
        from arrayjob.planner.pipeline import PASSES, strategies

        return PASSES if self.kind == "pass" else strategies(self.kind)


tiling_option = click.option("--tiling", type=PlannerChoice("tiling"), help="Tiling strategy.")
fusion_option = click.option("--fusion", type=PlannerChoice("fusion"), help="Fusion strategy.")
placement_option = click.option("--placement", type=PlannerChoice("placement"), help="Placement strategy.")

instance_option = click.option("--instance-type", default="local", show_default=True,
                               help="Instance type from the price table.")
prices_option = click.option("--prices", "prices_path", type=click.Path(dir_okay=False), help="Price table (TOML).")
profile_option = click.option("--profile", "profile_path", type=click.Path(dir_okay=False),
                              help="Machine profile from `arrayjob calibrate`.")
estimate_instance_option = click.option(
    "--instance-type", default=None, help="Instance type from the price table  [default: cluster.node_type, else local]")
nodes_option = click.option("--nodes", type=click.IntRange(min=1), default=None,
                            help="Nodes to run on  [default: chosen from the estimate]")


max_cost_option = click.option("--max-cost", type=click.FloatRange(min=0), help="Fail (exit 3) above this many dollars.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="arrayjob")
@debug_option
def cli(debug: bool) -> None:
    """Plan and run distributed linear-algebra ML jobs over Zarr arrays on Ray."""


def _overrides(overrides: tuple[str, ...]) -> list[str]:
    # RAY_ADDRESS is honoured over the spec; an explicit --set cluster.address wins over both.
    address = os.environ.get("RAY_ADDRESS")
    return ([f"cluster.address={json.dumps(address)}"] if address else []) + list(overrides)


@cli.command()
@click.argument("spec", type=click.Path())  # read (and checked) by load_spec: errors are one line
@set_option
@click.option("--overwrite", is_flag=True, help="Replace a complete output.")
@click.option("--no-wait", is_flag=True,
              help="If another run is writing the output, exit 6 at once instead of waiting for it.")
@click.option("--restart", is_flag=True,
              help="Start the fit afresh: remove the checkpoints a dead run left instead of resuming from them.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON instead of a summary.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the final line (and an error, if any).")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="How the run's progress is told: text (a live view on a terminal, else plain lines) "
                   "or one JSON object per event.")
@click.option("--log-to", type=click.Choice(["stderr", "stdout"]), default="stderr", show_default=True,
              help="Where the run's progress goes.")
@tiling_option
@fusion_option
@placement_option
@max_cost_option
@nodes_option
@deadline_option
@estimate_instance_option
@debug_option
def run(spec: str, overrides: tuple[str, ...], overwrite: bool, no_wait: bool, restart: bool, as_json: bool,
        quiet: bool, log_format: str, log_to: str, tiling: str | None, fusion: str | None, placement: str | None,
        max_cost: float | None, nodes: int | None, deadline: float | None, instance_type: str | None,
        debug: bool) -> None:
    """Run the job in SPEC and publish its result, report and _SUCCESS.

    With cluster.max_nodes, --nodes or --deadline the job sizes its cluster: it asks the
    autoscaler of the Ray at cluster.address for the node count `estimate` chooses, and
    gives the nodes back when it ends.
    """
    from arrayjob import runner
    from arrayjob.cli.format import final_line, summary
    from arrayjob.cli.progress import consumer
    from arrayjob.runtime.metrics import RunMetrics
    from arrayjob.spec import load_spec

    if as_json and log_to == "stdout":
        raise click.UsageError("--log-to stdout cannot be used with --json: stdout holds only the JSON report")
    job = load_spec(spec, [*_planner_overrides(tiling, fusion, placement), *_overrides(overrides)])
    metrics = RunMetrics()
    watcher = None if quiet else consumer(sys.stdout if log_to == "stdout" else sys.stderr, job=job.name,
                                          log_format=log_format)
    if watcher is not None:
        metrics.listen(watcher)
    try:
        # Ray's driver prints what its raylets report (a node that died, a worker killed) to
        # sys.stdout; stdout carries only the summary or the JSON report, so those go to stderr.
        with contextlib.redirect_stdout(sys.stderr):
            outcome = runner.run(job, overwrite=overwrite, instance_type=instance_type, wait=not no_wait,
                                 restart=restart, metrics=metrics,
                                 notify=(lambda line: None) if watcher is None else watcher.notice,
                                 nodes=nodes, deadline=deadline,
                                 check_cost=None if max_cost is None else lambda est: _check_cost(est, max_cost),
                                 # a tracking server's trouble: above a live view, in the JSON lines
                                 warn=_warn if watcher is None else lambda line: watcher.notice(f"warning: {line}"))
    finally:
        if watcher is not None:
            watcher.close()
    if as_json:
        document = outcome.report or {"job": job.name, "already_complete": True, "manifest": outcome.manifest}
        click.echo(json.dumps(document, indent=2))
    elif quiet:
        click.echo(final_line(outcome))
    else:
        click.echo(summary(outcome, table=sys.stdout.isatty()))


@cli.command()
@click.argument("spec", type=click.Path())  # read (and checked) by load_spec: errors are one line
@set_option
@click.option("--stop-after", type=PlannerChoice("pass"), default="cost",
              show_default=True, help="Show the plan after this pass.")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="Simulated cluster nodes.")
@click.option("--workers-per-node", type=click.IntRange(min=1), default=None,
              help="Workers (CPUs) per simulated node  [default: this machine's CPUs]")
@tiling_option
@fusion_option
@placement_option
@click.option("--format", "fmt", type=click.Choice(["text", "json", "dot"]), default="text", show_default=True)
@instance_option
@debug_option
def plan(spec: str, overrides: tuple[str, ...], stop_after: str, nodes: int, workers_per_node: int | None,
         tiling: str | None, fusion: str | None, placement: str | None, fmt: str, instance_type: str,
         debug: bool) -> None:
    """Show how SPEC would run, without reading data: tiling, kernels, tasks, cost.

    For iterative jobs this is the plan of one iteration. Nodes have the memory of
    --instance-type; a plan that needs more is warned of on stderr.
    """
    from arrayjob import runner
    from arrayjob.costing.estimate import memory_warning
    from arrayjob.costing.prices import load_prices
    from arrayjob.lazy import capture
    from arrayjob.planner.pipeline import make_plan
    from arrayjob.planner.plan import ClusterShape
    from arrayjob.planner.show import render
    from arrayjob.spec import load_spec

    job_spec = load_spec(spec, [*_planner_overrides(tiling, fusion, placement), *overrides])
    instance = load_prices().instance(instance_type)
    job = runner.prepare(job_spec)
    cluster = ClusterShape(nodes=nodes, workers_per_node=workers_per_node or os.cpu_count() or 1,
                           memory_per_node=int(instance.memory_gib * 2**30))
    graph = capture(list(job.program(cluster.workers).values()))
    options = runner.plan_options(job_spec, cluster)
    result = make_plan(graph, options, stop_after)
    title = f"{job_spec.name}: {job.describe()} — plan of one pass, after {stop_after}"
    click.echo(render(result, fmt, title, header={"job": job_spec.name, "algorithm": job_spec.algorithm,
                                                  "stop_after": stop_after}))
    if result.cost is not None:
        _warn(memory_warning(result.cost.peak_bytes_per_node, instance))


def _warn(message: str) -> None:
    if message:  # on stderr: stdout carries only the plan or estimate (--format json stays parseable)
        click.echo(f"arrayjob: warning: {message}", err=True)


def _choose(job_spec, job, *, nodes: int | None, deadline: float | None, instance_type: str | None,
            iterations: int | None, prices_path: str | None, profile_path: str | None):
    from arrayjob.costing.history import recent_history
    from arrayjob.costing.prices import load_prices
    from arrayjob.costing.profile import load_profile
    from arrayjob.costing.sizing import choose_nodes

    prices = load_prices(prices_path)
    instance = prices.instance(instance_type or job_spec.cluster.node_type or "local")
    profile = load_profile(profile_path)
    return choose_nodes(job, job_spec, nodes=nodes, deadline=deadline, instance=instance, prices=prices,
                        profile=profile, iterations=iterations, history=recent_history(job_spec, profile))


def _check_cost(est, max_cost: float | None) -> None:
    from arrayjob.errors import CostLimitError

    total = est.dollars()["total"]
    if max_cost is not None and total > max_cost:
        shown, limit = _over(total, max_cost)
        raise CostLimitError(f"estimated cost ${shown} exceeds --max-cost ${limit}")


def _over(total: float, limit: float) -> tuple[str, str]:
    """``total`` and ``limit`` (``total > limit``) as decimals that still show ``total > limit``:
    four places as a rule, more when four would round them equal ($0.0000 over $0)."""
    from decimal import Decimal

    exact = format(Decimal(repr(limit)), "f")  # the limit as given: 0, 0.01, 0.000001
    exact = exact.rstrip("0").rstrip(".") if "." in exact else exact
    for places in range(4, 18):
        shown = f"{total:.{places}f}"
        if Decimal(shown) > Decimal(exact):
            return shown, exact
    return format(Decimal(repr(total)), "f"), exact




@cli.command()
@click.argument("spec", type=click.Path())  # read (and checked) by load_spec: errors are one line
@set_option
@nodes_option
@deadline_option
@estimate_instance_option
@click.option("--iterations", type=click.IntRange(min=1), help="Iterations to assume [default: params.max_iter].")
@max_cost_option
@prices_option
@profile_option
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@debug_option
def estimate(spec: str, overrides: tuple[str, ...], nodes: int | None, deadline: float | None,
             instance_type: str | None, iterations: int | None, max_cost: float | None, prices_path: str | None,
             profile_path: str | None, fmt: str, debug: bool) -> None:
    """Predict time, memory, traffic and dollars for SPEC, reading metadata only.

    The node count is --nodes, else the cheapest that meets --deadline, else the smallest
    whose object stores hold the plan (raised while the extra nodes pay for themselves, up
    to cluster.max_nodes); the table says which and why.
    """
    from arrayjob import runner
    from arrayjob.costing.table import table
    from arrayjob.spec import load_spec

    job_spec = load_spec(spec, list(overrides))
    job = runner.prepare(job_spec)
    choice = _choose(job_spec, job, nodes=nodes, deadline=deadline, instance_type=instance_type,
                     iterations=iterations, prices_path=prices_path, profile_path=profile_path)
    est = choice.estimate
    if fmt == "json":
        click.echo(json.dumps({**est.as_dict(), "choice": choice.as_dict()}, indent=2))
    else:
        click.echo(table(est, choice.line))
    _warn(est.memory_warning)
    _check_cost(est, max_cost)


@cli.command()
@click.argument("output_uri")
@click.option("--json", "as_json", is_flag=True, help="Print the published run's report.json as it is.")
@click.option("--endpoint-url", help="S3-compatible endpoint [default: AWS_ENDPOINT_URL, else AWS].")
@click.option("--aws-profile", help="Named AWS profile for the credentials [default: the standard chain].")
@debug_option
def show(output_uri: str, as_json: bool, endpoint_url: str | None, aws_profile: str | None, debug: bool) -> None:
    """Summarise the run published at OUTPUT_URI (the job's output.uri), from its report.json."""
    from arrayjob.cli.format import published_summary
    from arrayjob.io.locations import StorageOptions, parse_uri
    from arrayjob.io.output import read_published_report

    location = parse_uri(output_uri, key="OUTPUT_URI")
    options = StorageOptions(endpoint_url=endpoint_url, profile=aws_profile)
    manifest, report = read_published_report(location, options)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(published_summary(location, manifest, report, table=sys.stdout.isatty()))


@cli.command()
@click.argument("model_uri")
@click.option("--format", "fmt", type=click.Choice(["sklearn", "onnx"]), default="sklearn", show_default=True,
              help="sklearn: a scikit-learn estimator saved with skops; onnx: ONNX through skl2onnx "
                   "(pip install 'arrayjob[onnx]').")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="The file to write.")
@click.option("--endpoint-url", help="S3-compatible endpoint [default: AWS_ENDPOINT_URL, else AWS].")
@click.option("--aws-profile", help="Named AWS profile for the credentials [default: the standard chain].")
@debug_option
def export(model_uri: str, fmt: str, output: str, endpoint_url: str | None, aws_profile: str | None,
           debug: bool) -> None:
    """Write the model published at MODEL_URI (a job's output.uri) as a file other systems score
    with: a scikit-learn estimator with its fitted attributes set, or ONNX."""
    from arrayjob.export import export_model
    from arrayjob.io.locations import StorageOptions, parse_uri

    location = parse_uri(model_uri, key="MODEL_URI")
    click.echo(export_model(location, StorageOptions(endpoint_url=endpoint_url, profile=aws_profile), fmt, output))


@cli.command()
@click.option("--bucket", default=".arrayjob/bucket", show_default=True, help="Bucket URI to measure.")
@click.option("--output", type=click.Path(dir_okay=False), help="Where to save [default: .arrayjob/profile.json].")
@set_option
@debug_option
def calibrate(bucket: str, output: str | None, overrides: tuple[str, ...], debug: bool) -> None:
    """Measure this machine (or the connected cluster) and the bucket for `estimate`."""
    import dataclasses
    import time

    from arrayjob.costing.calibrate import calibrate as measure
    from arrayjob.costing.calibrate import cold_start_seconds
    from arrayjob.costing.profile import save_profile
    from arrayjob.io.locations import StorageOptions, parse_uri
    from arrayjob.runtime.cluster import ray_cluster
    from arrayjob.spec import ClusterOptions

    address = os.environ.get("RAY_ADDRESS", "local")
    # a local Ray is started by each job in a fresh process: measure that; else time connecting
    startup, shutdown = cold_start_seconds(address) if address == "local" else (0.0, 0.0)
    start = time.perf_counter()
    with ray_cluster(ClusterOptions(address=address)) as cluster:
        connect = time.perf_counter() - start
        profile = measure(parse_uri(bucket, key="--bucket"), StorageOptions(), cluster.node_ids, cluster.cpus,
                          startup or connect, shutdown)
        stopping = time.perf_counter()
    if address != "local":
        profile = dataclasses.replace(profile, shutdown_seconds=time.perf_counter() - stopping)
    path = save_profile(profile, output)
    click.echo(f"saved {path}:")
    click.echo(profile.to_json())


@cli.command()
@click.argument("algorithm")
@click.argument("uri")
@click.option("--rows", type=int, default=200_000, show_default=True)
@click.option("--cols", type=int, default=32, show_default=True)
@click.option("--chunk-rows", type=int, default=25_000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--k", "clusters", type=int, default=8, show_default=True, help="Clusters (kmeans), components (gmm).")
@click.option("--classes", type=int, default=2, show_default=True,
              help="Classes (logreg; more than 2: multinomial labels 0..K-1).")
@click.option("--rank", type=int, default=8, show_default=True, help="Rank (mttkrp, cp_als, pca, als).")
@click.option("--shape", default="", help="Tensor shape I,J,K (mttkrp, cp_als) [default: rows,cols,cols].")
@click.option("--edges", type=int, default=0, help="Edges (pagerank) [default: 10 × rows].")
@click.option("--nnz-per-row", type=int, default=0,
              help="Write X sparse, a CSR group with this many non-zeros a row (logreg, linreg, kmeans); "
                   "als: ratings a user (required).")
@click.option("--density", type=float, default=0.0,
              help="Write X sparse, with this fraction of each row non-zero (logreg, linreg, kmeans, als).")
@click.option("--format", "output_format", type=click.Choice(["zarr", "parquet"]), default="zarr", show_default=True,
              help="als: parquet writes the ratings as a table ratings/part-*.parquet of user, item and rating "
                   "columns instead of the CSR group R.zarr.")
@debug_option
def datagen(algorithm: str, uri: str, rows: int, cols: int, chunk_rows: int, seed: int, clusters: int,
            classes: int, rank: int, shape: str, edges: int, nnz_per_row: int, density: float, output_format: str,
            debug: bool) -> None:
    """Write demo input arrays for ALGORITHM under URI (Zarr v3; X as a sparse CSR group in
    AnnData's layout with --nnz-per-row or --density; als: the ratings R, users × items, such a
    group, or with --format parquet a table of (user, item, rating) rows)."""
    from arrayjob.datagen import DatagenRequest, generate
    from arrayjob.errors import SpecError
    from arrayjob.io.locations import StorageOptions, parse_uri
    from arrayjob.units import size

    location = parse_uri(uri, key="URI")
    try:
        dims = tuple(int(s) for s in shape.split(",")) if shape else ()
    except ValueError:
        raise SpecError(f"datagen: --shape expects sizes like 400,400,400, got {shape!r}") from None
    request = DatagenRequest(location, rows, cols, chunk_rows, seed, StorageOptions(), k=clusters, rank=rank,
                             shape=dims, edges=edges, nnz_per_row=nnz_per_row, density=density, classes=classes,
                             table=output_format == "parquet")
    counters = generate(algorithm, request)
    click.echo(f"wrote {algorithm} demo data to {location}: {size(counters.bytes_written)} "
               f"in {counters.put_requests:,} requests")


for _command in (submit, status, logs, stop, deploy):
    cli.add_command(_command)
