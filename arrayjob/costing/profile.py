"""A machine profile: the rates the time model needs, measured by ``arrayjob calibrate``.

A default profile ships (measured on a 2-core, 24 GiB cloud VM with a loopback S3
server); ``estimate`` says which profile it used.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arrayjob.errors import SpecError
from arrayjob.planner.cost import WORK_KINDS
from arrayjob.planner.plan import SHIPPED_FLOPS_PER_S, SHIPPED_TASK_SECONDS, WorkRates
from arrayjob.planner.plan import SHIPPED_WORK_RATES as _SHIPPED

DEFAULT_PATH = Path(".arrayjob/profile.json")


@dataclass(frozen=True)
class MachineProfile:
    name: str
    memory_bytes_per_s: float  # one core streaming through memory
    flops_per_s: float  # one core, float64 GEMM (square); the rate of work kinds without their own
    storage_read_bytes_per_s: float  # one node's workers reading blocks into the object store
    storage_write_bytes_per_s: float  # one node's workers writing blocks into the bucket (lazy.store)
    request_seconds: float  # latency of one small GET
    task_overhead_seconds: float  # Ray, per task
    network_bytes_per_s: float  # between nodes (memory rate on one node)
    startup_seconds: float = 3.0  # starting a local Ray instance
    shutdown_seconds: float = 1.4  # stopping it
    warmup_seconds: float = 0.6  # the first tasks on a fresh cluster (worker processes start)
    run_overhead_seconds: float = 0.02  # the driver's part of one program run (submit, fetch, account)
    # one core, by kind of work (planner.cost.WORK_KINDS); defaults measured on the shipped VM
    # (planner.plan.SHIPPED_WORK_RATES, which placement uses without a profile)
    # elements through one numexpr operation (a * b), in cache
    elementwise_per_s: float = _SHIPPED["elementwise"]
    # elements through exp / log1p
    transcendental_per_s: float = _SHIPPED["transcendental"]
    # operand bytes of matrix × vector (BLAS gemv)
    contraction_bytes_per_s: float = _SHIPPED["contraction_bytes"]
    # tall-skinny products (XᵀX, 64 columns)
    contraction_flops_per_s: float = _SHIPPED["contraction_flops"]
    # three-operand contractions (MTTKRP's three modes)
    einsum_flops_per_s: float = _SHIPPED["einsum_flops"]
    # algorithms.tsqr.qr_block on a 65,536 × 64 block
    qr_flops_per_s: float = _SHIPPED["qr_flops"]
    # algorithms.tsqr.solve_block (trsm) on a 131,072 × 64 block
    triangular_solve_flops_per_s: float = _SHIPPED["triangular_solve_flops"]
    # edges per second, algorithms.pagerank.graph.SplitByTarget on 2^21 edges
    edge_split_per_s: float = _SHIPPED["edge_split"]
    # edges per second, algorithms.pagerank.graph.BuildBlock of 2^23 edges
    edge_build_per_s: float = _SHIPPED["edge_build"]
    # nonzeros per second of a CSR matrix × vector (512K nodes)
    sparse_product_per_s: float = _SHIPPED["sparse_product"]
    # the same gathering from a 32 MiB vector (4M nodes)
    sparse_product_large_per_s: float = _SHIPPED["sparse_product_large"]
    # a task's fresh 128 MiB result into the object store
    result_bytes_per_s: float = _SHIPPED["result_bytes"]
    # one node's workers reading back blocks they spilled to local disk (.npy, as the runtime
    # streams them under a memory budget); against storage_read_bytes_per_s it decides where a
    # streamed block comes back from. The spill is mapped from the page cache, not copied:
    # ``calibrate.spill_rate`` measured 8.9-9.5 GB/s here (2026-11-25, load average 3.7;
    # 1.5 GB/s when each block was copied out with np.load)
    spill_read_bytes_per_s: float = 9e9
    measured_at: str = ""
    bucket: str = ""

    def rate(self, kind: str) -> float:
        """The rate of a kind of work (``planner.cost.WORK_KINDS``): ``<kind>_per_s``, or the
        field named for its unit (``contraction_bytes`` -> ``contraction_bytes_per_s``)."""
        return float(getattr(self, f"{kind}_per_s", self.flops_per_s))

    def placement_rates(self) -> dict[str, Any]:
        """This profile's rates as ``planner.plan.ClusterShape`` carries them, so placement
        weighs compute against traffic at the rates the estimate prices with."""
        return {"memory_bytes_per_s": self.memory_bytes_per_s, "network_bytes_per_s": self.network_bytes_per_s,
                "work_rates": WorkRates({kind: self.rate(kind) for kind in WORK_KINDS}, default=self.flops_per_s),
                "task_seconds": self.task_overhead_seconds}

    @property
    def calibrated(self) -> bool:
        """Measured here by ``arrayjob calibrate``, not the shipped default."""
        return bool(self.measured_at)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)


SHIPPED = MachineProfile(
    name="shipped default (2-core 24 GiB VM, loopback S3)",
    memory_bytes_per_s=8e9,
    flops_per_s=SHIPPED_FLOPS_PER_S,
    storage_read_bytes_per_s=4e8,
    storage_write_bytes_per_s=2e8,
    request_seconds=0.004,
    task_overhead_seconds=SHIPPED_TASK_SECONDS,
    network_bytes_per_s=1e9,
)


# what a summary says of an estimate made with the shipped profile
UNCALIBRATED = ("uncalibrated: made with the shipped profile, not this machine's; run `arrayjob calibrate` once "
                "in the directory you run jobs from (it saves .arrayjob/profile.json there, which later "
                "estimates and runs started there use)")


def load_profile(path: str | Path | None = None) -> MachineProfile:
    """The profile at ``path``, else the one ``calibrate`` saved here, else the shipped one."""
    candidate = Path(path) if path else DEFAULT_PATH
    if not candidate.exists():
        if path:
            raise SpecError(f"--profile: no profile at {path} (run arrayjob calibrate)")
        return SHIPPED
    try:
        raw = json.loads(candidate.read_text())
        known = {f.name for f in dataclasses.fields(MachineProfile)}
        return MachineProfile(**{k: v for k, v in raw.items() if k in known})  # rates since retired are ignored
    except (ValueError, TypeError) as exc:
        raise SpecError(f"--profile: {candidate} is not a machine profile: {exc}") from None


def save_profile(profile: MachineProfile, path: str | Path | None = None) -> Path:
    target = Path(path) if path else DEFAULT_PATH
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(profile.to_json() + "\n")
    return target
