"""A YAML node → a typed settings object, strictly: an unknown key, a wrong type or a value
outside its rule is a :class:`ConfigError` naming the key path and the line."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import yaml

from redline.config.rules import refusal
from redline.errors import ConfigError


def yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's complaint without its own multi-line quote of the source."""
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    if problem is None:
        return str(exc).splitlines()[0]
    return f"{context}, {problem}" if context else str(problem)


def where(file: str, node: yaml.Node) -> str:
    return f"{file}:{node.start_mark.line + 1}"


def build(cls: type, node: yaml.Node, file: str, prefix: str) -> Any:
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{where(file, node)}: '{prefix or 'top level'}' must be a mapping")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.name != "source"}
    values: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = key_node.value
        path = f"{prefix}.{key}" if prefix else key
        if key not in names:
            known = ", ".join(sorted(names))
            raise ConfigError(f"{where(file, key_node)}: unknown key '{path}' (known: {known})")
        values[key] = value = convert(hints[key], value_node, file, path)
        refused = refusal(cls, key, value, path)
        if refused is not None:
            index, message = refused
            at = value_node.value[index] if index is not None else value_node
            raise ConfigError(f"{where(file, at)}: {message}")
    return cls(**values)


def convert(hint: Any, node: yaml.Node, file: str, path: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
            if type(None) in args:
                return None
        non_none = [a for a in args if a is not type(None)]
        return convert(non_none[0], node, file, path)
    if dataclasses.is_dataclass(hint):
        return build(hint, node, file, path)  # type: ignore[arg-type]
    if origin is list:
        if not isinstance(node, yaml.SequenceNode):
            raise ConfigError(f"{where(file, node)}: '{path}' must be a list")
        return [convert(args[0], item, file, f"{path}[{i}]") for i, item in enumerate(node.value)]
    if origin is dict:
        if not isinstance(node, yaml.MappingNode):
            raise ConfigError(f"{where(file, node)}: '{path}' must be a mapping")
        return {k.value: convert(args[1], v, file, f"{path}.{k.value}") for k, v in node.value}
    if not isinstance(node, yaml.ScalarNode):
        raise ConfigError(f"{where(file, node)}: '{path}' must be a single {hint.__name__}")
    value = yaml.safe_load(yaml.serialize(node))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is Any or (isinstance(value, hint) and not (hint is int and isinstance(value, bool))):
        return value
    raise ConfigError(
        f"{where(file, node)}: '{path}' must be {hint.__name__}, got {type(value).__name__} "
        f"{value!r}"
    )

