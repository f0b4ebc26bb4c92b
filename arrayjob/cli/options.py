"""Options that several commands share."""

from __future__ import annotations

import click

debug_option = click.option("--debug", is_flag=True, help="Show tracebacks.")
set_option = click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE",
    help="Override a spec key, e.g. --set params.l2=0.01 (repeatable).",
)
