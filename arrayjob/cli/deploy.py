"""``arrayjob deploy``: a cluster definition sized from the job's plan."""

from __future__ import annotations

import shlex
import sys

import click

from arrayjob import __version__
from arrayjob.cli.options import deadline_option, debug_option, set_option


@click.command()
@click.argument("spec", type=click.Path())  # read (and checked) by load_spec: errors are one line
@click.option("--target", type=click.Choice(["ray-cluster", "kuberay"]), required=True,
              help="ray-cluster: Ray's cluster launcher on AWS (ray up); kuberay: a RayJob for KubeRay.")
@click.option("--nodes", type=click.IntRange(min=1), help="Worker nodes [default: chosen from the estimate, as `estimate` does].")
@deadline_option
@click.option("--max-nodes", type=click.IntRange(min=1), help="The autoscaler's upper bound [default: the count chosen].")
@click.option("--instance-type", default="r5.2xlarge", show_default=True, help="Worker node type from the price table.")
@click.option("--iterations", type=click.IntRange(min=1), help="Iterations to assume [default: params.max_iter].")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), help="Write here [default: stdout].")
@click.option("--region", default="us-east-1", show_default=True, help="ray-cluster: the AWS region.")
@click.option("--head-profile", default="arrayjob-head", show_default=True,
              help="ray-cluster: the head's IAM instance profile (Ray's autoscaler permissions and S3).")
@click.option("--worker-profile", default="arrayjob-worker", show_default=True,
              help="ray-cluster: the workers' IAM instance profile (S3).")
@click.option("--package", default=f"arrayjob=={__version__}", show_default=True,
              help="ray-cluster: what the nodes pip install.")
@click.option("--image", help="kuberay: an image with Ray and arrayjob  [default: arrayjob:VERSION, deploy/kuberay/Dockerfile]")
@click.option("--service-account", default="arrayjob", show_default=True, help="kuberay: the pods' service account.")
@click.option("--role-arn", default="arn:aws:iam::ACCOUNT_ID:role/arrayjob-s3", show_default=True,
              help="kuberay: the IAM role the service account assumes for S3 (IRSA).")
@click.option("--ttl", type=click.IntRange(min=0), default=600, show_default=True,
              help="kuberay: seconds the finished RayJob is kept.")
@set_option
@debug_option
def deploy(spec: str, target: str, nodes: int | None, deadline: float | None, max_nodes: int | None, instance_type: str,
           iterations: int | None, output: str | None, region: str, head_profile: str, worker_profile: str,
           package: str, image: str | None, service_account: str, role_arn: str, ttl: int,
           overrides: tuple[str, ...], debug: bool) -> None:
    """Write a cluster definition for SPEC, sized from its plan: node type, workers, object store.

    Reads metadata only, as `estimate` does.
    """
    from arrayjob import runner
    from arrayjob.cluster_definitions import cluster_definition, size_cluster
    from arrayjob.costing.prices import load_prices
    from arrayjob.costing.profile import load_profile
    from arrayjob.errors import SpecError
    from arrayjob.spec import load_spec
    from arrayjob.submission import sent_spec

    if nodes is not None and deadline is not None:
        raise SpecError("--nodes, --deadline: give one of them, not both")
    if instance_type == "local":
        raise SpecError("--instance-type: 'local' is this machine; name a cloud node type from the price table")
    job_spec = load_spec(spec, list(overrides))
    local = [f"inputs.{name}" for name, loc in job_spec.inputs.items() if not loc.is_s3]
    local += [] if job_spec.output.is_s3 else ["output.uri"]
    if local:
        click.echo(f"arrayjob: warning: {', '.join(local)}: local paths; every node of the cluster must see them "
                   "at the same place (s3:// needs nothing)", err=True)
    prices = load_prices()
    sized = size_cluster(runner.prepare(job_spec), job_spec, instance=prices.instance(instance_type), prices=prices,
                         profile=load_profile(), nodes=nodes, max_nodes=max_nodes, iterations=iterations,
                         deadline=deadline)
    command = shlex.join(["arrayjob", "deploy", *sys.argv[2:]]) if sys.argv[1:2] == ["deploy"] else "arrayjob deploy"
    text = cluster_definition(target, job_spec, sized, sent_spec(job_spec), command, {
        "region": region, "head_profile": head_profile, "worker_profile": worker_profile, "package": package,
        "image": image or f"arrayjob:{__version__}", "service_account": service_account, "role_arn": role_arn,
        "ttl": ttl})
    if output is None:
        click.echo(text, nl=False)
    else:
        with open(output, "w") as f:
            f.write(text)
        click.echo(f"wrote {output}", err=True)
    for line in sized.lines():
        click.echo(f"arrayjob: {line}", err=True)
