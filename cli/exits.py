"""The CLI's error contract: which exit status an error means, and the one line it prints.

Every verb runs under the ``streamio`` group, whose ``invoke`` hands any exception that escapes a
verb to :func:`fail`. So the mapping lives here, once, keyed on the classes of the one error tree
(:mod:`streamio.errors`), never on message text:

* **0** -- done; for ``verify`` / ``ckpt verify``: everything was read and checked and is good.
* **1** -- the command read the data or checkpoint and it is bad: corrupt, truncated, malformed,
  inconsistent with its index or manifest (``CorruptDataError``, ``DatasetError``,
  ``CheckpointError`` and their subclasses, a failed ``plan`` check).
* **2** -- usage: an unknown option, a bad option value (``--max-size 0``, ``ConfigError``), a URL
  streamio cannot use (``foo://``, ``s3:/x``: ``UnsupportedProtocolError``), an impossible request
  for this dataset (``PlanError``: more ranks than samples with ``--policy drop``), a ``shard`` SRC
  holding what is never packed (``SourceError``: a FIFO, a link leaving SRC). click's code.
* **3** -- could not check: storage unreachable or refusing access, an I/O error, or the dataset /
  checkpoint named on the command line does not exist (``StorageError``, ``CacheError``,
  ``IndexNotFoundError``, ``CheckpointNotFoundError``, any ``OSError``) -- and any exception from
  outside the tree (a bug in streamio or in a dependency), which cannot vouch for the data either.
* **130** -- interrupted (Ctrl-C); **143** -- terminated (SIGTERM): a verb stops as on Ctrl-C,
  its cleanup runs (a ``shard`` leaves the previous dataset whole and removes its temp files);
  **141** -- stdout was closed (``streamio ls URL | head``, or no stdout at all: ``>&-``).

Why "not found" is 3 and not 1: ``verify`` is run by scripts and monitors that must tell "the bytes
are corrupt, rebuild them" from "the job could not look" (a typo in a URL, an expired token, an
unreachable endpoint). A dataset or checkpoint that is not where the command line says was not
checked at all. A *part* of a dataset or checkpoint that is missing while its index or manifest
names it is different: that is found by checking, and ``verify`` reports it as bad (1).

The message is one line on stderr, ``Error: <message>``; a streamio error's message already names
the URL / shard / step at fault and what to do. Tracebacks only with ``streamio -vv VERB ...``.
"""

from __future__ import annotations

import enum
import os
import select
import signal
import sys
import textwrap
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import click

from streamio.errors import (
    CacheError,
    CheckpointConflictError,
    CheckpointError,
    CheckpointNotFoundError,
    ConfigError,
    CorruptDataError,
    DatasetError,
    IndexNotFoundError,
    PlanError,
    SourceError,
    StateMismatchError,
    StorageError,
    StreamioError,
    UnsupportedProtocolError,
)

__all__ = [
    "EXIT_CODES", "ExitCode", "Terminated", "claim_closed_stdout", "classify", "exit_codes_help", "exit_codes_short",
    "fail", "one_line", "sigterm_interrupts",
]


class ExitCode(enum.IntEnum):
    """The exit statuses of every ``streamio`` command."""

    OK = 0
    BAD = 1
    USAGE = 2
    UNCHECKED = 3
    INTERRUPTED = 130
    CLOSED_PIPE = 141
    TERMINATED = 143


EXIT_CODES: dict[ExitCode, str] = {
    ExitCode.OK: "success; verify: everything was checked and is good",
    ExitCode.BAD: "the data or checkpoint was read and is bad (corrupt, truncated, malformed)",
    ExitCode.USAGE: "usage: unknown option, bad option value, a URL streamio cannot use, impossible request",
    ExitCode.UNCHECKED: "could not check: storage unreachable, access denied, no such dataset or "
    "checkpoint, I/O error, or an unexpected error (run with -vv for the traceback)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
    ExitCode.CLOSED_PIPE: "stdout was closed (e.g. piped into head)",
    ExitCode.TERMINATED: "terminated (SIGTERM), stopped as on Ctrl-C",
}

# The first class an exception is an instance of decides; most specific first.
_BY_CLASS: tuple[tuple[type[BaseException], ExitCode], ...] = (
    (IndexNotFoundError, ExitCode.UNCHECKED),  # a DatasetError, but nothing was there to check
    (CheckpointNotFoundError, ExitCode.UNCHECKED),
    (CheckpointConflictError, ExitCode.UNCHECKED),  # another job holds the root: not a verdict
    (StateMismatchError, ExitCode.BAD),  # a resume state from another dataset / seed
    (PlanError, ExitCode.USAGE),  # the options ask for a split this dataset cannot give
    (UnsupportedProtocolError, ExitCode.USAGE),  # not a URL streamio can use (foo://, s3:/x)
    (SourceError, ExitCode.USAGE),  # `shard` refuses an entry of SRC (a FIFO, a link leaving it): change SRC
    (ConfigError, ExitCode.USAGE),  # an argument or setting is invalid
    (StorageError, ExitCode.UNCHECKED),
    (CacheError, ExitCode.UNCHECKED),
    (CorruptDataError, ExitCode.BAD),
    (DatasetError, ExitCode.BAD),
    (CheckpointError, ExitCode.BAD),
)

_MAX_MESSAGE = 2000


def classify(exc: BaseException) -> ExitCode:
    """The exit status ``exc`` means under the contract above (3 for anything unknown)."""
    for cls, code in _BY_CLASS:
        if isinstance(exc, cls):
            return code
    return ExitCode.UNCHECKED


def one_line(exc: BaseException) -> str:
    """``exc`` as the single line printed after ``Error:`` (bounded; URL userinfo and every secret
    this process holds blanked out, as a dependency's message may quote them)."""
    from streamio.storage.secrets import scrub  # here, not at the top: `streamio --help` must not load storage

    text = scrub(" ".join(str(exc).split())) or type(exc).__name__  # scrubbed before any cut
    if not isinstance(exc, (StreamioError, OSError)):
        text = f"unexpected {type(exc).__name__}: {text}"
    if len(text) > _MAX_MESSAGE:
        text = text[: _MAX_MESSAGE - 3] + "..."
    if isinstance(exc, StreamioError):
        return text
    if isinstance(exc, OSError):
        return f"{text} (run `streamio -vv ...` for the traceback)"
    return f"{text} (a bug in streamio or a dependency: run `streamio -vv ...` for the traceback and report it)"


def fail(exc: BaseException, *, verbose: int) -> NoReturn:
    """Print ``exc`` as the contract says (traceback only when ``verbose >= 2``) and exit."""
    if isinstance(exc, Terminated):
        click.echo("Aborted: terminated (SIGTERM).", err=True)
        raise click.exceptions.Exit(ExitCode.TERMINATED)
    if isinstance(exc, KeyboardInterrupt):
        click.echo("Aborted: interrupted.", err=True)
        raise click.exceptions.Exit(ExitCode.INTERRUPTED)
    if isinstance(exc, BrokenPipeError) and _stdout_closed():
        _silence_stdout()
        raise click.exceptions.Exit(ExitCode.CLOSED_PIPE)
    if verbose >= 2:
        from streamio.storage.secrets import scrub

        click.echo(scrub("".join(traceback.format_exception(exc))), err=True, nl=False)
    click.echo(f"Error: {one_line(exc)}", err=True)
    raise click.exceptions.Exit(classify(exc))


def exit_codes_help() -> str:
    """The exit-status table for ``--help`` texts (``\\b`` keeps click from re-wrapping it)."""
    rows = "\n".join(
        textwrap.fill(text, width=76, initial_indent=f"  {int(code):<4}", subsequent_indent=" " * 6)
        for code, text in EXIT_CODES.items()
    )
    return f"\b\nExit status:\n{rows}"


def exit_codes_short() -> str:
    """One line naming the exit statuses, for the verbs whose ``--help`` does not show the table."""
    return "Exit status: 0 ok, 1 the data is bad, 2 usage, 3 could not check (see `streamio --help`)."


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports an error on the write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread: a verb stops as on Ctrl-C, its ``finally`` blocks and
    context managers run (the exception is not an ``Exception``, so nothing swallows it)."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """For the duration, SIGTERM raises :class:`Terminated` in the main thread (the previous
    handler is restored after). Outside the main thread, signals cannot be handled: nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def claim_closed_stdout() -> None:
    """Put a pipe without a reader on fd 1 when stdout is closed (``streamio ls URL --json >&-``).

    Python then leaves ``sys.stdout`` None and click prints nothing: the verb would exit 0 with its
    output lost, and the first file it opens would take fd 1. With a pipe whose reader is gone,
    output fails as it does into ``| head`` (``BrokenPipeError``), which :func:`fail` maps to 141.
    """
    try:
        os.fstat(1)
        return
    except OSError:
        pass
    read_end, write_end = os.pipe()
    os.dup2(write_end, 1)  # if the read end took the free fd 1, this closes it first
    for fd in {read_end, write_end} - {1}:
        os.close(fd)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 - lives as long as the process
