"""What every kgen command shares: the consoles, one-line messages and the --out check."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

from .errors import KgenError

console = Console(highlight=False)  # the terminal's width (COLUMNS; 80 when not a terminal): tables fit 80
err_console = Console(stderr=True, highlight=False)


def say(kind: str, style: str, message: str) -> None:
    """`kind: message` on stderr, one line; the message is printed as is (no markup)."""
    err_console.print(Text(f"{kind}: ", style=style) + Text(message), soft_wrap=True)


def fail(e: Exception) -> None:
    """The error's first line (and any detail lines it carries, e.g. an NVRTC log), then exit 1."""
    first, *detail = str(e).splitlines() or [type(e).__name__]
    say("error", "red", first)
    if detail:
        err_console.print(Text("\n".join(detail)))
    raise typer.Exit(1)


def writable_dir(path: Path, option: str = "--out") -> Path:
    """`path` as a directory kgen may write (created if missing), or a one-line error naming `option`."""
    if path.exists() and not path.is_dir():
        raise KgenError(f"{option} {path} is a file; give a directory (it is created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".kgen-write-test.{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise KgenError(f"{option} {path}: cannot write there ({e.strerror}); give a directory kgen may create "
                        f"and write") from None
    return path
