"""Remote runs through Ray Jobs: ``submit``, ``status``, ``logs``, ``stop``."""

from __future__ import annotations

import json

import click

from arrayjob.cli.options import debug_option, set_option

address_option = click.option(
    "--address", metavar="URL",
    help="Ray job server, e.g. http://HEAD:8265  [default: RAY_API_SERVER_ADDRESS, else RAY_ADDRESS]",
)


@click.command()
@click.argument("spec", type=click.Path())  # read (and checked) by load_spec: errors are one line
@address_option
@set_option
@click.option("--overwrite", is_flag=True, help="Replace a complete output.")
@click.option("--restart", is_flag=True, help="Start the fit afresh, not from a dead run's checkpoint.")
@click.option("--no-wait", is_flag=True, help="Print the job id and exit at once; the job runs on.")
@click.option("--upload-package", is_flag=True,
              help="Send this arrayjob package with the job, for a cluster without it (its dependencies must be there). "
                   "A job named as module:Class is always sent with it.")
@debug_option
def submit(spec: str, address: str | None, overrides: tuple[str, ...], overwrite: bool, restart: bool,
           no_wait: bool, upload_package: bool, debug: bool) -> None:
    """Run SPEC on a Ray cluster as a Ray job: follow its logs, exit with its exit code.

    The spec is checked here first (a bad one exits 2 and nothing is submitted), then sent
    resolved: --set applied and ${VAR} read from this machine's environment. Ctrl-C or
    SIGTERM stops the remote job, unless --no-wait detached it.
    """
    from arrayjob.errors import RemoteJobFailed, Terminated
    from arrayjob.spec import load_spec
    from arrayjob.submission import JobServer, job_end, write_stdout

    job_spec = load_spec(spec, list(overrides))
    server = JobServer.connect(address, debug=debug)
    run_options = [*(["--overwrite"] if overwrite else []), *(["--restart"] if restart else [])]
    job_id = server.submit(job_spec, run_options, upload_package=upload_package)
    if no_wait:
        click.echo(job_id)
        click.echo(f"arrayjob: submitted {job_id} to {server.address}; see it with arrayjob status|logs|stop {job_id}",
                   err=True)
        return
    click.echo(f"arrayjob: submitted {job_id} to {server.address}", err=True)
    try:
        server.follow(job_id, write_stdout)
        end = job_end(job_id, server.wait(job_id))
    except (KeyboardInterrupt, Terminated):
        server.stop(job_id)
        click.echo(f"arrayjob: stopping job {job_id}", err=True)
        raise
    if end.exit_code:
        raise RemoteJobFailed(end.line, end.exit_code)


@click.command()
@click.argument("job_id")
@address_option
@click.option("--json", "as_json", is_flag=True, help="Print the job's details as JSON.")
@debug_option
def status(job_id: str, address: str | None, as_json: bool, debug: bool) -> None:
    """Show the status of a submitted job: PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED."""
    from arrayjob.submission import JobServer, describe, status_lines

    server = JobServer.connect(address, debug=debug)
    described = describe(job_id, server.details(job_id))
    click.echo(json.dumps(described, indent=2) if as_json else "\n".join(status_lines(described)))


@click.command()
@click.argument("job_id")
@address_option
@click.option("--follow", "-f", is_flag=True, help="Follow the logs until the job ends, then exit with its exit code.")
@debug_option
def logs(job_id: str, address: str | None, follow: bool, debug: bool) -> None:
    """Print a submitted job's logs (its stdout and stderr)."""
    from arrayjob.errors import RemoteJobFailed
    from arrayjob.submission import JobServer, job_end, write_stdout

    server = JobServer.connect(address, debug=debug)
    if not follow:
        write_stdout(server.logs(job_id))
        return
    server.follow(job_id, write_stdout)
    end = job_end(job_id, server.wait(job_id))
    if end.exit_code:
        raise RemoteJobFailed(end.line, end.exit_code)


@click.command()
@click.argument("job_id")
@address_option
@debug_option
def stop(job_id: str, address: str | None, debug: bool) -> None:
    """Stop a submitted job: SIGTERM to its arrayjob run, which removes its staging and releases the output."""
    from arrayjob.submission import STOP_GRACE_SECONDS, JobServer

    server = JobServer.connect(address, debug=debug)
    if not server.stop(job_id):
        status = server.details(job_id).status
        click.echo(f"{job_id}: already ended ({status})")
        return
    info = server.wait(job_id, timeout=STOP_GRACE_SECONDS + 10)
    click.echo(f"{job_id}: {info.status}")
