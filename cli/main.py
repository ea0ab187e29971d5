"""``streamio``: the command-line entry point; each verb group lives in its own module."""

from __future__ import annotations

import logging

import click

from streamio import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="streamio")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """Stream datasets from and checkpoint to object storage (S3, GCS, any fsspec URL)."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


def _register() -> None:
    from streamio.cli import ckpt, dataset, plan

    for module in (dataset, plan, ckpt):
        module.register(cli)


_register()


def main() -> None:
    """Console-script entry point."""
    cli()


if __name__ == "__main__":
    main()
