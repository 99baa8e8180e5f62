"""The policy file: one YAML document covering devices, stages, pipelines, routes, QoS, the
scheduler, circuit breakers, the cache and data partitions.

:func:`load_policy` validates everything and returns an immutable :class:`Policy`; errors name
the file, line and key path (``policies/x.yaml:14: stages.ocr.variants.light.max_batch:
expected a positive integer, got -3``). :class:`PolicyStore` swaps snapshots atomically on
reload, so an in-flight request keeps the policy it started with.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

from pydantic import ValidationError
from pyrsistent import pmap

from hetero.framework.errors import PolicyNotFoundError, PolicySyntaxError, PolicyValidationError
from hetero.framework.policy.messages import describe_errors
from hetero.framework.policy.references import build_pipelines, check_references
from hetero.framework.policy.schema import PolicySpec, StageConfig
from hetero.framework.policy.yaml_source import load_located
from hetero.framework.stages import Pipeline

__all__ = [
    "Policy",
    "PolicySpec",
    "PolicyStore",
    "builtin_policy_text",
    "load_policy",
    "load_policy_text",
]

BUILTIN_PREFIX = "builtin:"


@dataclass(frozen=True, slots=True)
class Policy:
    """A validated, immutable policy snapshot.

    Attributes:
        spec: Every key of the file, as frozen models.
        pipelines: Checked DAGs by name, including one-step pipelines for routes to a stage.
        source: Where it came from (a path, or ``builtin:<name>``).
    """

    spec: PolicySpec
    pipelines: Mapping[str, Pipeline]
    source: str
    stages: dict[str, StageConfig] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # ``spec.stages`` as a plain dict: read several times per request, where a persistent
        # map's lookup costs several times a dict's
        object.__setattr__(self, "stages", dict(self.spec.stages))

    def pipeline_for_route(self, route: str) -> Pipeline:
        """The pipeline a route reaches; KeyError if no route matches."""
        return self.pipelines[self.spec.routes[route]]

    def with_stages(self, stages: Mapping[str, StageConfig]) -> Policy:
        """This policy with ``stages`` added or replaced (pipelines and routes unchanged): the
        engine's view while a model version runs beside the one serving, or a stage's old
        config put back after a rolled-back version swap."""
        if not stages:
            return self
        merged = pmap({**self.spec.stages, **stages})
        return Policy(self.spec.model_copy(update={"stages": merged}), self.pipelines, self.source)


def load_policy_text(text: str, source: str) -> Policy:
    """Validate policy ``text``; ``source`` names it in error messages."""
    located = load_located(text, source)
    if not isinstance(located.data, dict):
        raise PolicyValidationError(source, 1, "", "the policy must be a mapping of keys")
    try:
        spec = PolicySpec.model_validate(located.data)
    except ValidationError as err:
        problems = describe_errors(err, PolicySpec)
        problems.sort(key=lambda item: located.line_of(item[0]) or 0)
        key_path, message = problems[0]
        first = located.error(key_path, message)
        first.more = tuple(str(located.error(k, m)) for k, m in problems[1:])
        raise first from None
    check_references(spec, located)
    return Policy(spec=spec, pipelines=build_pipelines(spec, located), source=source)


def builtin_policy_text(name: str) -> str:
    """Text of a policy shipped in ``hetero.policies`` (``default``, ``gov-onprem``,
    ``sim/8xa100``)."""
    resource = files("hetero.policies").joinpath(f"{name}.yaml")
    if not resource.is_file():
        raise PolicyNotFoundError(f"{BUILTIN_PREFIX}{name}")
    return resource.read_text(encoding="utf-8")


def load_policy(path: str | Path) -> Policy:
    """Load and validate a policy file, or a shipped one named ``builtin:<name>``."""
    text_path = str(path)
    if text_path.startswith(BUILTIN_PREFIX):
        return load_policy_text(builtin_policy_text(text_path[len(BUILTIN_PREFIX) :]), text_path)
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise PolicyNotFoundError(text_path) from err
    except IsADirectoryError as err:
        raise PolicySyntaxError(text_path, None, "is a directory, not a policy file") from err
    except UnicodeDecodeError as err:
        raise PolicySyntaxError(text_path, None, f"not UTF-8 text ({err.reason})") from err
    except OSError as err:
        raise PolicySyntaxError(text_path, None, err.strerror or str(err)) from err
    return load_policy_text(text, text_path)


class PolicyStore:
    """Holds the current snapshot; :meth:`reload` validates a new one and swaps it atomically.

    A failed reload raises and leaves the current snapshot in place.
    """

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._lock = threading.Lock()

    @property
    def current(self) -> Policy:
        """The snapshot to use for a request that starts now."""
        return self._policy

    def reload(self, path: str | Path | None = None) -> Policy:
        """Load ``path`` (default: where the current policy came from) and make it current."""
        with self._lock:
            policy = load_policy(path if path is not None else self._policy.source)
            self._policy = policy
            return policy
