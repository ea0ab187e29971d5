"""``streamio``: the command-line entry point; each verb group lives in its own module.

The group is where the error contract of :mod:`streamio.cli.exits` is applied: any exception that
escapes a verb becomes one ``Error: ...`` line on stderr and the exit status its class means
(0 ok, 1 the data or checkpoint is bad, 2 usage, 3 could not check). click's own usage errors keep
click's handling (status 2). ``-vv`` adds the traceback.
"""

from __future__ import annotations

from typing import Any

import click

from streamio import __version__

from .exits import claim_closed_stdout, exit_codes_help, fail, sigterm_interrupts


class _Group(click.Group):
    """A click group that turns every escaping exception into the documented one-line exit.

    SIGTERM is handled as Ctrl-C while a verb runs (exit 143 instead of 130), and a closed stdout
    fails the verb's output as a closed pipe does (exit 141).
    """

    def invoke(self, ctx: click.Context) -> Any:
        claim_closed_stdout()
        try:
            with sigterm_interrupts():
                return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except (Exception, KeyboardInterrupt) as exc:
            fail(exc, verbose=ctx.params.get("verbose") or 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]}, epilog=exit_codes_help())
@click.version_option(__version__, prog_name="streamio")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug and tracebacks of errors).")
def cli(verbose: int) -> None:
    """Stream datasets from and checkpoint to object storage (S3, GCS, any fsspec URL)."""
    import logging  # here: `streamio --help` and `--version` do not pay for it

    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if verbose:  # the storage libraries' own loggers are guarded by every Store; this is every logger
        from streamio.storage.secrets import guard_handlers  # here: `streamio VERB --help` loads no storage

        guard_handlers()


def _register() -> None:
    from . import browse, ckpt, dataset, plan

    for module in (dataset, browse, plan, ckpt):
        module.register(cli)


_register()


def main() -> None:
    """Console-script entry point."""
    cli()


if __name__ == "__main__":
    main()
