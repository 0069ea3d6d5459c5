"""Every flag of every command is exercised by some test: a documented flag that no test runs will break.

The check reads the test sources: a flag counts as exercised when a test passes it on a command line
("--flag" as a string) or sets its config field (`field=...`, `"field": ...` or a TOML line `field = ...`
in a string). That cannot prove a test looks at the flag's effect, but it stops a new flag from landing untested.
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

from rookworld.cli import COMMANDS

TESTS = "\n".join(path.read_text() for path in Path(__file__).parent.glob("*.py"))


def _actions(name: str, parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from _actions(f"{name} {sub}", subparser)
        elif action.option_strings and not isinstance(action, argparse._HelpAction):
            yield name, action


def _every_flag() -> Iterator[tuple[str, str, str]]:
    for name, (module, _) in COMMANDS.items():
        parser = argparse.ArgumentParser(prog=f"rookworld {name}")
        importlib.import_module(module).add_arguments(parser)
        for command, action in _actions(name, parser):
            yield command, action.option_strings[-1], action.dest


def _exercised(flag: str, dest: str) -> bool:
    if any(f"{quote}{flag}{quote}" in TESTS for quote in "\"'"):
        return True
    return re.search(rf"\b{dest}=(?!None\b)|\"{dest}\":|[\"']{dest} = |\\n{dest} = ", TESTS) is not None


def test_every_flag_of_every_command_is_exercised_by_a_test():
    flags = list(_every_flag())
    assert len(flags) > 150  # every command's parser was read
    missing = [f"rookworld {command} {flag}" for command, flag, dest in flags if not _exercised(flag, dest)]
    assert not missing, "flags no test passes or sets: " + ", ".join(missing)
