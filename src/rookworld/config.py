"""Typed dataclass configs and the argparse flags derived from them.

Each config field carries its help text in `metadata={"help": ...}`; a flag `--field-name` is made
for it, and a TOML file may set the same fields by their Python names.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from rookworld.errors import UserError

C = TypeVar("C")


def _flag_type(annotation: Any) -> tuple[Any, bool]:
    """(scalar type, is_list) for a field annotation such as `int`, `str | None`, `list[str]`."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _flag_type(inner[0])
    if origin in (list, tuple):
        return typing.get_args(annotation)[0], True
    return annotation, False


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def finite_float(text: str) -> float:
    """A float flag's value: a finite number (a run's config is saved as JSON, which has no inf or nan, and no
    option means anything at them: 0 is the off of those that can be off)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def add_config_arguments(parser: argparse.ArgumentParser, config_cls: type,
                         sections: dict[str, list[str]] | None = None,
                         advanced: frozenset[str] = frozenset()) -> None:
    """Add one `--field-name` flag per field of `config_cls`; unset flags parse as None.

    With `sections` (title -> field names, see flag_groups.py) each flag goes to its `--help` section;
    a field in no section is an error, so every flag has a place. Fields in `advanced` say so in their help.
    """
    hints = typing.get_type_hints(config_cls)
    where = _sections(parser, sections) if sections else {}
    for field in dataclasses.fields(config_cls):
        if sections and field.name not in where:
            raise ValueError(f"config field {field.name!r} of {config_cls.__name__} is in no --help section "
                             "(add it to rookworld/flag_groups.py)")
        target = where.get(field.name, parser)
        scalar, is_list = _flag_type(hints[field.name])
        kind = {bool: _parse_bool, float: finite_float}.get(scalar, scalar)
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        prefix = "advanced: " if field.name in advanced else ""
        help_text = prefix + field.metadata.get("help", "")
        if "(default" not in help_text:  # a help that explains its default says it better
            help_text += f" (default: {default})"
        flag = "--" + field.name.replace("_", "-")
        if is_list:
            target.add_argument(flag, dest=field.name, type=kind, action="append", default=None, help=help_text)
        else:
            target.add_argument(flag, dest=field.name, type=kind, default=None, help=help_text,
                                metavar=field.name.upper() if scalar is not bool else "BOOL")


def _sections(parser: argparse.ArgumentParser, sections: dict[str, list[str]]) -> dict[str, Any]:
    """Field name -> its argparse group, creating each titled group once per parser."""
    groups = {group.title: group for group in parser._action_groups}
    for title in sections:
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
    return {name: groups[title] for title, names in sections.items() for name in names}


def load_toml(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise UserError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"config file {path} is not valid TOML: {exc}") from None


def _file_value(key: str, value: Any, annotation: Any) -> Any:
    """A config file's value of field `key`, of the field's type (an int where a float goes becomes one);
    UserError otherwise: a TOML string "false" must not switch an option on, nor 1.5 steps run as 2."""
    scalar, is_list = _flag_type(annotation)
    optional = type(None) in typing.get_args(annotation)
    if value is None and optional:
        return None
    items = value if is_list and isinstance(value, list) else None if is_list else [value]
    if items is not None and all(isinstance(item, scalar) and (scalar is bool or not isinstance(item, bool))
                                 or (scalar is float and isinstance(item, int) and not isinstance(item, bool))
                                 for item in items):
        converted = [float(item) if scalar is float else item for item in items]
        if not all(math.isfinite(item) for item in converted if scalar is float):
            raise UserError(f"config field {key} = {value!r}: expected a finite number; fix the config file")
        return converted if is_list else converted[0]
    wanted = f"a list of {scalar.__name__}" if is_list else scalar.__name__
    raise UserError(f"config field {key} = {value!r}: expected {wanted} (TOML: true/false, 3, 3.0e-5, \"text\", "
                    "[\"a\", \"b\"]); fix the config file")


def build_config(config_cls: type[C], args: argparse.Namespace | None = None,
                 file_values: dict[str, Any] | None = None) -> C:
    """Defaults, then the config file's values (checked against the fields' types), then the flags given."""
    names = {f.name for f in dataclasses.fields(config_cls)}
    hints = typing.get_type_hints(config_cls)
    values: dict[str, Any] = {}
    for key, value in (file_values or {}).items():
        if key not in names:
            raise UserError(f"unknown config field {key!r} for {config_cls.__name__}; known: {sorted(names)}")
        values[key] = _file_value(key, value, hints[key])
    if args is not None:
        for name in names:
            value = getattr(args, name, None)
            if value is not None:
                values[name] = value
    try:
        return config_cls(**values)
    except (TypeError, ValueError) as exc:
        raise UserError(f"invalid {config_cls.__name__}: {exc}") from None
