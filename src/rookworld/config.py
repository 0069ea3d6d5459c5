"""Typed dataclass configs and the argparse flags derived from them.

Each config field carries its help text in `metadata={"help": ...}`; a flag `--field-name` is made
for it, and a TOML file may set the same fields by their Python names.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import tomllib

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


def add_config_arguments(parser: argparse.ArgumentParser, config_cls: type) -> None:
    """Add one `--field-name` flag per field of `config_cls`; unset flags parse as None."""
    hints = typing.get_type_hints(config_cls)
    for field in dataclasses.fields(config_cls):
        scalar, is_list = _flag_type(hints[field.name])
        kind = _parse_bool if scalar is bool else scalar
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        help_text = f"{field.metadata.get('help', '')} (default: {default})"
        flag = "--" + field.name.replace("_", "-")
        if is_list:
            parser.add_argument(flag, dest=field.name, type=kind, action="append", default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=field.name, type=kind, default=None, help=help_text,
                                metavar=field.name.upper() if scalar is not bool else "BOOL")


def load_toml(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise UserError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"config file {path} is not valid TOML: {exc}") from None


def build_config(config_cls: type[C], args: argparse.Namespace | None = None,
                 file_values: dict[str, Any] | None = None) -> C:
    """Defaults, then the config file's values, then the flags that were given."""
    names = {f.name for f in dataclasses.fields(config_cls)}
    values: dict[str, Any] = {}
    for key, value in (file_values or {}).items():
        if key not in names:
            raise UserError(f"unknown config field {key!r} for {config_cls.__name__}; known: {sorted(names)}")
        values[key] = value
    if args is not None:
        for name in names:
            value = getattr(args, name, None)
            if value is not None:
                values[name] = value
    try:
        return config_cls(**values)
    except (TypeError, ValueError) as exc:
        raise UserError(f"invalid {config_cls.__name__}: {exc}") from None
