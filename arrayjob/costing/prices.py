"""The price table: instance dollars per hour and storage dollars per 1,000 requests.

A versioned TOML file ships with arrayjob (``prices.toml`` beside this module); users
override it with ``--prices FILE`` or ``ARRAYJOB_PRICES``. Every estimate names the
table's version among its assumptions.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from arrayjob.errors import SpecError
from arrayjob.units import parse_duration

DEFAULT = Path(__file__).with_name("prices.toml")


# Ray's object store takes this share of a node's memory unless told otherwise
# (ray_constants.DEFAULT_OBJECT_STORE_MEMORY_PROPORTION)
OBJECT_STORE_SHARE = 0.3


@dataclass(frozen=True)
class Instance:
    name: str
    usd_per_hour: float
    vcpus: int
    memory_gib: float
    object_store_gib: float | None = None  # Ray's default share of memory_gib when not given
    node_startup_seconds: float | None = None  # booting and joining Ray, when the table says

    @property
    def object_store_bytes(self) -> int:
        """The node's Ray object store: where its blocks live between tasks."""
        gib = self.object_store_gib if self.object_store_gib is not None else OBJECT_STORE_SHARE * self.memory_gib
        return int(gib * 2**30)


@dataclass(frozen=True)
class PriceTable:
    version: str
    source: str
    get_per_1000: float
    put_per_1000: float
    instances: dict[str, Instance]

    def instance(self, name: str) -> Instance:
        try:
            return self.instances[name]
        except KeyError:
            raise SpecError(f"--instance-type: {name!r} is not in price table {self.version} "
                            f"(expected one of: {', '.join(sorted(self.instances))})") from None


def _startup(value: object) -> float:
    if value == 0:
        return 0.0
    return parse_duration(value if isinstance(value, int | float | str) else str(value))


def load_prices(path: str | Path | None = None) -> PriceTable:
    path = Path(path or os.environ.get("ARRAYJOB_PRICES") or DEFAULT)
    try:
        raw = tomllib.loads(path.read_text())
        instances = {
            name: Instance(name, float(v["usd_per_hour"]), int(v["vcpus"]), float(v["memory_gib"]),
                           float(v["object_store_gib"]) if "object_store_gib" in v else None,
                           _startup(v["node_startup"]) if "node_startup" in v else None)
            for name, v in raw["instances"].items()
        }
        return PriceTable(str(raw["version"]), str(path), float(raw["storage"]["get_per_1000"]),
                          float(raw["storage"]["put_per_1000"]), instances)
    except FileNotFoundError:
        raise SpecError(f"--prices: no price table at {path}") from None
    except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise SpecError(f"--prices: {path} is not a valid price table: {exc}") from None
