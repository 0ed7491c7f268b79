"""What a subcommand of ``attnlab`` is: its name and help, the function that adds its
options and the handler that runs it (or, for a group such as ``bench``, its subcommands)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One subcommand: ``add_arguments`` adds its options to its parser, ``run`` takes the
    parsed arguments and returns the exit status (importing heavy modules itself, so that
    ``--help`` and argument errors stay fast)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None

    def register(self, subparsers: argparse._SubParsersAction) -> None:
        """Add this command's parser, options and handler to ``subparsers``."""
        parser = subparsers.add_parser(self.name, help=self.help, description=self.description)
        self.add_arguments(parser)
        parser.set_defaults(func=self.run)


@dataclass(frozen=True)
class CommandGroup:
    """A subcommand made of subcommands (``attnlab bench attention``); the parsed arguments
    name the chosen one in ``dest``."""

    name: str
    help: str
    dest: str
    commands: Sequence[Command]

    def register(self, subparsers: argparse._SubParsersAction) -> None:
        """Add this group's parser and its subcommands to ``subparsers``."""
        parser = subparsers.add_parser(self.name, help=self.help)
        register_all(parser.add_subparsers(dest=self.dest, required=True), self.commands)


def register_all(subparsers: argparse._SubParsersAction,
                 commands: Sequence[Command | CommandGroup]) -> None:
    """Register each of ``commands`` with ``subparsers``, in order (the order of ``--help``)."""
    for command in commands:
        command.register(subparsers)
