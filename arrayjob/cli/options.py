"""Options that several commands share."""

from __future__ import annotations

import click

debug_option = click.option("--debug", is_flag=True, help="Show tracebacks.")
set_option = click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE",
    help="Override a spec key, e.g. --set params.l2=0.01 (repeatable).",
)


def _duration_value(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    from arrayjob.units import parse_duration

    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


deadline_option = click.option("--deadline", callback=_duration_value, metavar="DURATION",
                               help="Choose the cheapest node count the estimate finishes within, e.g. 20m.")
