"""Cluster definitions sized from a job's plan: ``arrayjob deploy``.

Two targets: Ray's cluster launcher on AWS (``ray up``: a head and an autoscaling worker
type, S3 by instance profile) and KubeRay (a RayJob whose cluster lives as long as the job,
S3 by the pods' service account). Both are sized the same way, from the estimate
(``costing.estimate``): the node type's CPUs and memory from the price table, the node
count (``--nodes``, else the smallest that meets ``--deadline``, else the smallest whose
object stores hold the plan's peak per node), and each node's object store from that peak.
Neither file holds a credential.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from arrayjob import __version__
from arrayjob.costing.estimate import MEMORY_HEADROOM, Estimate, estimate_job
from arrayjob.costing.prices import Instance, PriceTable
from arrayjob.costing.profile import MachineProfile
from arrayjob.errors import CostLimitError, SpecError
from arrayjob.spec import JobSpec
from arrayjob.units import size

TARGETS = ("ray-cluster", "kuberay")
OBJECT_STORE_SHARE = 0.3  # Ray's default object store: 30 % of a node's memory
# the most of a node's memory an object store may take: workers need the rest (on Kubernetes,
# within a pod given POD_MEMORY_SHARE of the node)
OBJECT_STORE_MAX_SHARE = 0.55
POD_MEMORY_SHARE = 0.85  # the rest of a node is the kubelet's and the system daemons'
DEADLINE_SEARCH = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # node counts a --deadline tries
HEAD_INSTANCE = "m5.xlarge"  # the head schedules and runs the driver: no block tasks (num-cpus 0)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")


def parse_deadline(text: str) -> float:
    """``90``, ``90s``, ``20m``, ``1.5h``, ``1d`` -> seconds."""
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise SpecError(f"--deadline: expected a duration such as 90s, 20m or 2h, got {text!r}")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2) or "s"]


@dataclass(frozen=True)
class ClusterSize:
    """What a cluster definition is sized by, and why."""

    instance: Instance
    nodes: int  # workers the plan is made for: min_workers
    max_nodes: int  # the autoscaler's bound
    object_store_bytes: int  # per worker
    peak_bytes: int  # the plan's most on one node, at ``nodes``
    wall_seconds: float
    dollars: float
    reason: str

    def lines(self) -> list[str]:
        return [
            f"{self.nodes} × {self.instance.name} ({self.instance.vcpus} vCPUs, {self.instance.memory_gib:g} GiB), "
            f"up to {self.max_nodes}: {self.reason}",
            f"object store {size(self.object_store_bytes)} per node for a plan peak of {size(self.peak_bytes)}; "
            f"estimated {self.wall_seconds:.0f} s and ${self.dollars:.4f} per run",
        ]


def object_store_bytes(peak: int, instance: Instance) -> int:
    """Ray's default share of the node's memory, or more if the plan's peak (with
    ``MEMORY_HEADROOM`` to spare) needs it, up to ``OBJECT_STORE_MAX_SHARE``; whole MiB."""
    memory = instance.memory_gib * 2**30
    wanted = max(OBJECT_STORE_SHARE * memory, peak / MEMORY_HEADROOM)
    return int(min(wanted, OBJECT_STORE_MAX_SHARE * memory)) // 2**20 * 2**20


def _holds(est: Estimate, instance: Instance) -> bool:
    peak = max(est.peak_bytes_per_node, default=0)
    return peak <= MEMORY_HEADROOM * OBJECT_STORE_MAX_SHARE * instance.memory_gib * 2**30


def size_cluster(job: Any, spec: JobSpec, *, instance: Instance, prices: PriceTable, profile: MachineProfile,
                 nodes: int | None = None, deadline: float | None = None, max_nodes: int | None = None,
                 iterations: int | None = None) -> ClusterSize:
    """Size a cluster for ``job`` on ``instance`` nodes from its estimate (nothing is read).

    Issue 16's ``costing.sizing.choose_nodes`` (not merged yet) makes the same choice with
    more rules (``[cluster] min_nodes``/``max_nodes``, parallel efficiency); once it is here
    this becomes ``choice = choose_nodes(job, spec, instance=..., prices=..., profile=...,
    nodes=nodes, deadline=deadline, max_nodes=max_nodes, iterations=iterations)`` and a
    ``ClusterSize`` of ``choice.nodes``, ``choice.estimate`` and ``choice.reason``.
    """

    def priced(count: int) -> Estimate:
        return estimate_job(job, spec, nodes=count, instance=instance, prices=prices, profile=profile,
                            iterations=iterations)

    if nodes is not None:
        est, reason = priced(nodes), "--nodes"
    elif deadline is not None:
        tried = []
        for count in DEADLINE_SEARCH:
            est = priced(count)
            tried.append(f"{count}: {est.wall_seconds:.0f} s")
            if est.wall_seconds <= deadline and _holds(est, instance):
                reason = f"the fewest nodes estimated within the deadline of {deadline:g} s ({est.wall_seconds:.0f} s)"
                break
        else:
            raise CostLimitError(f"--deadline: no cluster of up to {DEADLINE_SEARCH[-1]} × {instance.name} is "
                                 f"estimated within {deadline:g} s ({', '.join(tried)})")
    else:
        count = 1
        est = priced(count)
        while not _holds(est, instance) and count < DEADLINE_SEARCH[-1]:
            per_node = MEMORY_HEADROOM * OBJECT_STORE_MAX_SHARE * instance.memory_gib * 2**30
            count = min(DEADLINE_SEARCH[-1], max(count + 1, math.ceil(sum(est.peak_bytes_per_node) / per_node)))
            est = priced(count)
        reason = ("one node holds the plan" if count == 1
                  else f"the fewest nodes whose object stores hold the plan ({count})")
    count = est.nodes
    peak = max(est.peak_bytes_per_node, default=0)
    bound = max(count, max_nodes or count)
    return ClusterSize(instance, count, bound, object_store_bytes(peak, instance), peak, est.wall_seconds,
                       est.dollars()["total"], reason)


# -- the files -------------------------------------------------------------------------------


def _name(spec: JobSpec) -> str:
    """A name Kubernetes and EC2 accept: lower case letters, digits and '-'."""
    return re.sub(r"[^a-z0-9-]+", "-", f"arrayjob-{spec.name}".lower()).strip("-")[:53]


def _header(spec: JobSpec, sized: ClusterSize, command: str) -> str:
    lines = [f"Generated by arrayjob {__version__}: {command}", f"for job {spec.name} ({spec.algorithm}):",
             *sized.lines(), "No credentials here: S3 access comes from the nodes' own identity."]
    return "".join(f"# {line}\n" for line in lines)


def ray_cluster(spec: JobSpec, sized: ClusterSize, *, region: str, head_profile: str, worker_profile: str,
                package: str) -> dict[str, Any]:
    """A Ray cluster launcher config (``ray up``) for AWS."""
    store = sized.object_store_bytes
    return {
        "cluster_name": _name(spec),
        "max_workers": sized.max_nodes,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 5,
        "provider": {"type": "aws", "region": region, "cache_stopped_nodes": False},
        "auth": {"ssh_user": "ubuntu"},
        "available_node_types": {
            "head": {
                # the head runs the driver and schedules; block tasks go to workers only
                "resources": {"CPU": 0},
                "node_config": {"InstanceType": HEAD_INSTANCE, "IamInstanceProfile": {"Name": head_profile}},
            },
            "worker": {
                "min_workers": sized.nodes,
                "max_workers": sized.max_nodes,
                "resources": {"CPU": sized.instance.vcpus},
                "node_config": {"InstanceType": sized.instance.name, "IamInstanceProfile": {"Name": worker_profile}},
            },
        },
        "head_node_type": "head",
        "setup_commands": [f"pip install --quiet {package}"],
        "head_start_ray_commands": [
            "ray stop",
            "ulimit -n 65536; ray start --head --port=6379 --num-cpus=0 --dashboard-host=0.0.0.0 "
            "--object-manager-port=8076 --autoscaling-config=~/ray_bootstrap_config.yaml",
        ],
        "worker_start_ray_commands": [
            "ray stop",
            f"ulimit -n 65536; ray start --address=$RAY_HEAD_IP:6379 --object-manager-port=8076 "
            f"--object-store-memory={store}",
        ],
    }


def kuberay_job(spec: JobSpec, sized: ClusterSize, sent_spec: dict[str, Any], *, image: str,
                service_account: str, role_arn: str, ttl_seconds: int) -> list[dict[str, Any]]:
    """A RayJob (with the ConfigMap holding the spec and the ServiceAccount S3 access is
    granted to, by IRSA's role annotation) for KubeRay's operator."""
    import tomli_w

    name = _name(spec)
    vcpus, memory = sized.instance.vcpus, sized.instance.memory_gib
    cpu, memory_gi = max(1, vcpus - 1), max(1, math.floor(memory * POD_MEMORY_SHARE))
    store = sized.object_store_bytes
    spec_volume = {"name": "spec", "configMap": {"name": f"{name}-spec"}}
    mount = {"name": "spec", "mountPath": "/home/ray/spec", "readOnly": True}
    worker_resources = {"cpu": str(cpu), "memory": f"{memory_gi}Gi"}
    ray_job = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "arrayjob", "arrayjob/job": spec.name}},
        "spec": {
            "entrypoint": "arrayjob run /home/ray/spec/spec.toml",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": ttl_seconds,
            "submissionMode": "K8sJobMode",
            "backoffLimit": 0,  # arrayjob's exit code says whether another try can help: left to the caller
            "rayClusterSpec": {
                "rayVersion": _ray_version(),
                "enableInTreeAutoscaling": True,
                "autoscalerOptions": {"upscalingMode": "Default", "idleTimeoutSeconds": 300},
                "headGroupSpec": {
                    "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
                    "template": {"spec": {
                        "serviceAccountName": service_account,
                        "containers": [{
                            "name": "ray-head", "image": image,
                            "resources": {"requests": {"cpu": "2", "memory": "8Gi"},
                                          "limits": {"cpu": "2", "memory": "8Gi"}},
                            "ports": [{"containerPort": 6379, "name": "gcs"},
                                      {"containerPort": 8265, "name": "dashboard"}],
                            "volumeMounts": [mount],
                        }],
                        "volumes": [spec_volume],
                    }},
                },
                "workerGroupSpecs": [{
                    "groupName": "workers",
                    "replicas": sized.nodes,
                    "minReplicas": sized.nodes,
                    "maxReplicas": sized.max_nodes,
                    "rayStartParams": {"num-cpus": str(cpu), "object-store-memory": str(store)},
                    "template": {"spec": {
                        "serviceAccountName": service_account,
                        "containers": [{
                            "name": "ray-worker", "image": image,
                            "resources": {"requests": dict(worker_resources), "limits": dict(worker_resources)},
                        }],
                    }},
                }],
            },
        },
    }
    config_map = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"{name}-spec"},
        "data": {"spec.toml": tomli_w.dumps(sent_spec)},
    }
    account = {
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": service_account, "annotations": {"eks.amazonaws.com/role-arn": role_arn}},
    }
    return [account, config_map, ray_job]


def _ray_version() -> str:
    from importlib.metadata import version

    return version("ray")


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the spec in the ConfigMap) as literal blocks, readable as written."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _text)


def render(documents: list[dict[str, Any]], header: str) -> str:
    body = "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=1000) for d in documents)
    return header + body


def deploy_file(target: str, spec: JobSpec, sized: ClusterSize, sent_spec: dict[str, Any], command: str,
                options: dict[str, Any]) -> str:
    """The cluster definition for ``target``, as YAML text."""
    header = _header(spec, sized, command)
    if target == "ray-cluster":
        return render([ray_cluster(spec, sized, region=options["region"], head_profile=options["head_profile"],
                                   worker_profile=options["worker_profile"], package=options["package"])], header)
    if target == "kuberay":
        return render(kuberay_job(spec, sized, sent_spec, image=options["image"], service_account=options["service_account"],
                                  role_arn=options["role_arn"], ttl_seconds=options["ttl"]), header)
    raise SpecError(f"--target: expected one of {', '.join(TARGETS)}, got {target!r}")
