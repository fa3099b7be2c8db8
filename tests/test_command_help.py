"""Every flag of every command says what it does in `--help` (an operator reads flags there, not in the code),
and `--version` says which release it is."""

import argparse
import importlib.metadata
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest

from api.version import release
from controller.__main__ import parse_args as controller_args
from controller.kubectl_plugin import parse_args as kubectl_plugin_args
from launcher.__main__ import parse_args as launcher_args
from requester.__main__ import parse_args as requester_args


class _Parsed(Exception):
    """Raised in place of parsing, carrying the parser the command built."""


def parsers_of(parse_args: Callable[..., Any]) -> list[argparse.ArgumentParser]:
    """The parser the command builds (and its subcommands' parsers), caught before it parses anything."""

    def catch(self: argparse.ArgumentParser, *_: Any, **__: Any) -> None:
        raise _Parsed(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", catch), pytest.raises(_Parsed) as caught:
        parse_args([])
    parser: argparse.ArgumentParser = caught.value.args[0]
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [parser, *(sub for action in subparsers for sub in action.choices.values())]


@pytest.mark.parametrize(
    "parse_args",
    [launcher_args, controller_args, requester_args, kubectl_plugin_args],
    ids=["launcher", "controller", "requester", "kubectl-dualpods"],
)
def test_every_flag_has_help(parse_args: Callable[..., Any]) -> None:
    silent = [
        f"{parser.prog}: {'/'.join(action.option_strings)}"
        for parser in parsers_of(parse_args)
        for action in parser._actions
        if action.option_strings and not action.help
    ]
    assert silent == []


@pytest.mark.parametrize(
    "parse_args",
    [launcher_args, controller_args, requester_args, kubectl_plugin_args],
    ids=["launcher", "controller", "requester", "kubectl-dualpods"],
)
def test_every_command_says_its_release(parse_args: Callable[..., Any], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        parse_args(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.split()[-1] == release() == importlib.metadata.version("dualpods")
