"""Reading YAML while remembering the line of every key, so errors can name it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from hetero.framework.errors import PolicySyntaxError, PolicyValidationError

__all__ = ["KeyPath", "LocatedYaml", "format_key_path", "load_located"]

KeyPath = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class LocatedYaml:
    """Parsed data plus the 1-based line of each key path."""

    data: Any
    lines: dict[KeyPath, int]
    path: str

    def line_of(self, key_path: KeyPath) -> int | None:
        """The line of ``key_path``, or of its nearest ancestor that has one."""
        for end in range(len(key_path), -1, -1):
            line = self.lines.get(tuple(key_path[:end]))
            if line is not None:
                return line
        return None

    def error(self, key_path: KeyPath, problem: str) -> PolicyValidationError:
        """A validation error pointing at ``key_path``."""
        return PolicyValidationError(
            self.path, self.line_of(key_path), format_key_path(key_path), problem
        )


def format_key_path(key_path: KeyPath) -> str:
    """``stages.ocr.variants[0]`` style."""
    text = ""
    for part in key_path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def load_located(text: str, path: str) -> LocatedYaml:
    """Parse ``text`` (from ``path``) with yaml.SafeLoader, recording lines and refusing
    duplicate keys."""
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as err:
            mark = err.problem_mark or err.context_mark
            line = mark.line + 1 if mark is not None else None
            problem = " ".join(p for p in (err.context, err.problem) if p) or str(err)
            raise PolicySyntaxError(path, line, problem) from err
        except yaml.YAMLError as err:
            raise PolicySyntaxError(path, None, str(err)) from err
        if node is None:
            return LocatedYaml(data=None, lines={}, path=path)
        lines: dict[KeyPath, int] = {}
        _walk(loader, node, (), lines, path)
        try:
            data = loader.construct_document(node)
        except yaml.MarkedYAMLError as err:
            mark = err.problem_mark
            raise PolicySyntaxError(
                path, mark.line + 1 if mark else None, str(err.problem)
            ) from err
        return LocatedYaml(data=data, lines=lines, path=path)
    finally:
        loader.dispose()


def _walk(
    loader: yaml.SafeLoader,
    node: yaml.Node,
    key_path: KeyPath,
    lines: dict[KeyPath, int],
    path: str,
) -> None:
    lines.setdefault(key_path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise PolicyValidationError(
                    path,
                    key_node.start_mark.line + 1,
                    format_key_path(key_path),
                    "keys must be plain scalars",
                )
            key = loader.construct_object(key_node)
            key = key if isinstance(key, str | int) else str(key)
            if key in seen:
                raise PolicyValidationError(
                    path,
                    key_node.start_mark.line + 1,
                    format_key_path((*key_path, key)),
                    "duplicate key",
                )
            seen.add(key)
            lines[(*key_path, key)] = key_node.start_mark.line + 1
            _walk(loader, value_node, (*key_path, key), lines, path)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(loader, item, (*key_path, index), lines, path)
