"""Which job class a spec's ``algorithm`` names: a built-in (``logreg``), a user's class
(``"my_package.ridge:Ridge"``), or a name an installed distribution registers under the
entry-point group ``arrayjob.algorithms`` (``pip install acme-jobs`` makes ``"acme.ridge"`` work).

A name two of them claim (a built-in and an entry point, or two entry points) is an error
naming both: nothing wins silently. Every problem is one ``SpecError`` line (exit 2); an
exception raised while importing the user's module is the job's own (``JobCodeError``, exit 8).
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import EntryPoint, entry_points

from arrayjob.algorithms import JOBS
from arrayjob.api import Job
from arrayjob.errors import JobCodeError, SpecError, blames_job, code_home, is_arrayjob_module

ENTRY_POINT_GROUP = "arrayjob.algorithms"


def registered() -> dict[str, list[EntryPoint]]:
    """The entry points of group ``arrayjob.algorithms``, by name (several when distributions clash)."""
    found: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, []).append(ep)
    return found


def job_names() -> list[str]:
    """The built-in algorithms and those installed distributions register."""
    return sorted(set(JOBS) | set(registered()))


def _origin(ep: EntryPoint) -> str:
    dist = ep.dist.name if ep.dist is not None else "an installed distribution"
    return f"entry point {ep.name!r} of {dist} ({ep.value})"


def get_job(name: str) -> type[Job]:
    """The job class ``name`` stands for (see the module's docstring)."""
    if ":" in name:
        return load_class(name, name)
    claims = registered().get(name, [])
    if name in JOBS and claims:
        builtin = JOBS[name]
        raise SpecError(f"job.algorithm: {name!r} is both the built-in {builtin.__module__}:{builtin.__qualname__} "
                        f"and {_origin(claims[0])}; name the class as \"module:Class\"")
    if name in JOBS:
        return JOBS[name]
    if len(claims) > 1:
        raise SpecError(f"job.algorithm: {name!r} is both {_origin(claims[0])} and {_origin(claims[1])}; "
                        "name the class as \"module:Class\"")
    if claims:
        return load_class(claims[0].value, name)
    raise SpecError(f"job.algorithm: unknown algorithm {name!r} (expected one of: {', '.join(job_names())}, "
                    "or a job class as \"module:Class\")")


def load_class(target: str, algorithm: str) -> type[Job]:
    """Import ``"module:Class"`` and check it is a job."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute or not all(p.isidentifier() for p in
                                                    [*module_name.split("."), *attribute.split(".")]):
        raise SpecError(f"job.algorithm: expected a built-in name or \"module:Class\", got {algorithm!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise SpecError(f"job.algorithm: no module {exc.name!r} to import {target!r} from "
                            "(is its directory on PYTHONPATH, or its package installed?)") from None
        raise JobCodeError.raised(exc, algorithm, module_name, " (importing it)") from exc
    except Exception as exc:
        raise JobCodeError.raised(exc, algorithm, module_name, " (importing it)") from exc
    found: object = module
    for part in attribute.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise SpecError(f"job.algorithm: module {module_name!r} ({module.__file__}) has no {attribute!r}")
    if not (isinstance(found, type) and issubclass(found, Job)):
        raise SpecError(f"job.algorithm: {target} is not a job (expected a subclass of arrayjob.api.Job, "
                        f"got {found!r})")
    missing = [a for a in ("inputs", "Params") if not hasattr(found, a)]
    if missing or getattr(found, "__abstractmethods__", None):
        lacks = [*missing, *sorted(getattr(found, "__abstractmethods__", ()))]
        raise SpecError(f"job.algorithm: {target} is not a complete job: it lacks {', '.join(lacks)}")
    _loaded[found.__module__] = algorithm
    return found


# The user's job modules loaded so far, and the algorithm each was named by: an exception that
# reaches the CLI is the job's own when raised in one of them (``blame``).
_loaded: dict[str, str] = {}


def blame(exc: BaseException) -> JobCodeError | None:
    """``exc`` as the error of the user's job whose code raised it, or None (arrayjob's own)."""
    for module, algorithm in _loaded.items():
        if not is_arrayjob_module(module) and blames_job(exc, module):
            return JobCodeError.raised(exc, algorithm, module)
    return None


def job_code(job: type[Job]) -> tuple[str, ...]:
    """What of a user's job a remote Ray needs to import it: its top-level package's directory
    (or its top-level module's file). Nothing for a built-in job."""
    if is_arrayjob_module(job.__module__):
        return ()
    return tuple(path.rstrip(os.sep) for path in code_home(job.__module__))
