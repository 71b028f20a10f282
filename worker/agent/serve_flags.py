"""The ``worker serve`` flags an agent runs with: checked, made independent of the directory, read back.

They are checked by the very parser ``worker`` builds for ``worker serve``
(``specwire.process.command_line.subcommand_parser``: serve's own flags and the
common ones such as ``--log-level``), so install accepts exactly what serve
does. launchd starts an agent in ``/``, so relative paths are made absolute:
every path-typed flag (``--token-file``, ``--tls-cert``, ``--log-file``...),
``--model`` when it names a file or directory here (otherwise it is a Hugging
Face id), and the profile of ``--pace`` when it is a file here.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from specwire.errors import InvalidArgumentError
from specwire.models import DEFAULT_MODEL
from specwire.process.command_line import subcommand_parser
from worker.server import serve


@dataclass(frozen=True)
class ServeFlags:
    """Serve flags, as given (``argv``) and as parsed (``args``)."""

    argv: list[str]
    args: argparse.Namespace

    @property
    def address(self) -> str:
        """``host:port`` the worker listens on."""
        return f"{self.args.host}:{self.args.port}"

    @property
    def ports(self) -> list[int]:
        """The TCP ports the worker will listen on: gRPC, then echo (none for ``--port 0``)."""
        if self.args.echo_port is not None:
            return [p for p in (self.args.port, self.args.echo_port) if p]
        return [self.args.port, self.args.port + 1] if self.args.port else []


def parser() -> argparse.ArgumentParser:
    """``worker serve``'s parser, raising instead of exiting."""
    return subcommand_parser("worker", serve)


def parse(argv: list[str]) -> ServeFlags:
    """Check ``argv`` as ``worker serve`` would; a flag it does not take is one clear error."""
    try:
        args, unknown = parser().parse_known_args(argv)
    except argparse.ArgumentError as err:
        raise InvalidArgumentError(f"the serve flags: {err}") from err
    if unknown:
        raise InvalidArgumentError(f"worker serve takes no {' '.join(unknown)}: see `worker serve --help`")
    return ServeFlags(list(argv), args)


def absolute(flags: ServeFlags, cwd: Path) -> ServeFlags:
    """``flags`` with each relative path in them made absolute against ``cwd``."""
    p = parser()
    out: list[str] = []
    words = iter(flags.argv)
    for word in words:
        option, eq, inline = word.partition("=")
        action = _action(p, option) if word.startswith("--") else None
        if action is None or action.nargs == 0:
            out.append(word)
            continue
        value = inline if eq else next(words, None)
        if value is None:
            out.append(word)
            continue
        value = _absolute_value(action, value, cwd)
        out.extend([f"{option}={value}"] if eq else [option, value])
    return parse(out)


def with_flag(flags: ServeFlags, option: str, value: str) -> ServeFlags:
    """``flags`` with ``option value`` added, unless the option is already given."""
    dest = option.lstrip("-").replace("-", "_")
    if getattr(flags.args, dest) is not None:
        return flags
    return parse([*flags.argv, option, value])


def _action(p: argparse.ArgumentParser, option: str) -> argparse.Action | None:
    """The action of a long option as argparse resolves it, abbreviations included."""
    options = p._option_string_actions  # argparse has no public map of option strings to actions
    if option in options:
        return options[option]
    matches = {a for name, a in options.items() if name.startswith("--") and name.startswith(option)}
    return matches.pop() if len(matches) == 1 else None


def _absolute_value(action: argparse.Action, value: str, cwd: Path) -> str:
    if action.type is Path:
        return str(_under(cwd, value))
    if action.dest == "model":
        return _existing_model(value, cwd)
    if action.dest == "pace":
        profile, sep, machine = value.rpartition(":")
        if sep and profile and _under(cwd, profile).is_file():
            return f"{_under(cwd, profile)}:{machine}"
    return value


def _existing_model(spec: str, cwd: Path) -> str:
    """``SOURCE[@DTYPE]`` with SOURCE made absolute when it is a file or directory here."""
    if spec == DEFAULT_MODEL:
        return spec
    for source, suffix in ((spec, ""), (spec.rpartition("@")[0], "@" + spec.rpartition("@")[2])):
        if source and _under(cwd, source).exists():
            return f"{_under(cwd, source)}{suffix}"
    return spec


def _under(cwd: Path, value: str) -> Path:
    return Path(os.path.normpath(cwd / Path(value).expanduser()))  # an absolute value stays as it is
