"""The ``arrayjob`` process: runs a command (``cli.commands``), turns every error into one
line and its exit code (tracebacks only with ``--debug``), and turns SIGTERM into an orderly
unwinding with a deadline."""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback

import click

from arrayjob.cli.commands import cli
from arrayjob.errors import ArrayJobError, Terminated


def _one_line(message: str) -> str:
    """``message`` with its line breaks escaped: a key or value from the spec may hold one."""
    return message.translate({ord(c): repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"})


TERMINATED = "arrayjob: terminated (SIGTERM)"
TERMINATE_DEADLINE = 8.0  # seconds from SIGTERM to exit, cleanup or not: Kubernetes kills at 30
_deadlines: list[threading.Timer] = []


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM: raise ``Terminated`` in the main thread, once, so the job unwinds as on Ctrl-C.
    Should the unwinding hang, the process still ends in ``TERMINATE_DEADLINE`` seconds."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short

    def give_up() -> None:
        sys.stderr.write(f"{TERMINATED}; cleanup did not finish in {TERMINATE_DEADLINE:g} s\n")
        sys.stderr.flush()
        os._exit(Terminated.exit_code)

    timer = threading.Timer(TERMINATE_DEADLINE, give_up)
    timer.daemon = True
    timer.start()
    _deadlines.append(timer)
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    """Entry point: one line per error, the exit code of its class, tracebacks only with --debug."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    if not debug:
        from arrayjob.io.storage import quiet_async_teardown

        quiet_async_teardown()
    handles = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if handles else None
    try:
        return _run(args, debug)
    finally:
        while _deadlines:  # cleanup finished in time
            _deadlines.pop().cancel()
        if handles and previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _signal_cause(exc: BaseException) -> BaseException | None:
    """The signal behind ``exc``, if any: raised inside C code (Ray's, NumPy's) a signal's
    exception can come out wrapped, e.g. as "SystemError: ... returned a result with an
    exception set" with the signal's exception as its cause."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, (Terminated, KeyboardInterrupt)):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _click_message(exc: click.ClickException) -> str:
    """Click's error as our one line: ``--deadline: expected a duration ...`` for a bad value,
    click's own sentence (``No such option: --nods``) otherwise; the command's ``--help`` says
    the rest."""
    if isinstance(exc, click.BadParameter) and not isinstance(exc, click.MissingParameter) and exc.param is not None:
        names = exc.param.opts if isinstance(exc.param, click.Option) else [exc.param.human_readable_name]
        return f"{'/'.join(names)}: {exc.message}"
    return " ".join(exc.format_message().split())


def _error(exc: ArrayJobError, debug: bool) -> int:
    if debug:  # a job's own error carries its traceback (a worker's, for a block function)
        text = getattr(exc, "traceback_text", "")
        sys.stderr.write(text) if text else traceback.print_exc()
    click.echo(f"arrayjob: error: {_one_line(str(exc))}", err=True)
    return exc.exit_code


def _run(args: list[str], debug: bool) -> int:
    try:
        cli.main(args=args, prog_name="arrayjob", standalone_mode=False)
    except click.ClickException as exc:  # a bad option or argument: one line, as every error
        click.echo(f"arrayjob: error: {_click_message(exc)}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("arrayjob: interrupted", err=True)
        return 130
    except KeyboardInterrupt:
        click.echo("arrayjob: interrupted", err=True)
        return 130
    except Terminated:
        click.echo(TERMINATED, err=True)
        return Terminated.exit_code
    except ArrayJobError as exc:
        return _error(exc, debug)
    except Exception as exc:  # noqa: BLE001 - a bug: say so in one line, details with --debug
        stop = _signal_cause(exc)
        if isinstance(stop, Terminated):
            click.echo(TERMINATED, err=True)
            return Terminated.exit_code
        if isinstance(stop, KeyboardInterrupt):
            click.echo("arrayjob: interrupted", err=True)
            return 130
        from arrayjob.catalog import blame

        own = blame(exc)  # raised in a user's job: its error, not arrayjob's
        if own is not None:
            return _error(own, debug)
        if debug:
            traceback.print_exc()
        click.echo(f"arrayjob: internal error: {type(exc).__name__}: {_one_line(str(exc))} (rerun with --debug for a traceback)", err=True)
        return 1
    return 0


def entry_point() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry_point()
