"""The conformance pytest plugin (entry point ``pytest11``), inert unless ``--hetero-backend``.

Options:
    --hetero-backend=NAME                 the backend to test, by registry name
    --hetero-conformance-exclude=REGEX    deselect conformance tests whose node id matches
                                          (repeatable), for bringing a backend up gradually
    --hetero-conformance-xfail=REGEX      mark matching conformance tests as expected failures
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from hetero.framework.backend import Backend
from hetero.framework.registry import default_registry

BACKEND_OPTION = "--hetero-backend"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the conformance options."""
    group = parser.getgroup("hetero", "hetero backend conformance")
    group.addoption(BACKEND_OPTION, default=None, metavar="NAME", help="backend to test")
    group.addoption(
        "--hetero-conformance-exclude",
        action="append",
        default=[],
        metavar="REGEX",
        help="deselect conformance tests whose node id matches",
    )
    group.addoption(
        "--hetero-conformance-xfail",
        action="append",
        default=[],
        metavar="REGEX",
        help="mark matching conformance tests as expected failures",
    )


def _backend_name(config: pytest.Config) -> str | None:
    name = config.getoption(BACKEND_OPTION, default=None)
    return str(name) if name else None


def _is_conformance(item: pytest.Item) -> bool:
    cls = getattr(item, "cls", None)
    return bool(cls is not None and getattr(cls, "conformance", False))


def pytest_ignore_collect(collection_path: Any, config: pytest.Config) -> bool | None:
    """Without ``--hetero-backend``, modules named ``test_conformance*.py`` are not collected."""
    if _backend_name(config) is None and collection_path.name.startswith("test_conformance"):
        return True
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``conformance_device`` over every device of the backend under test."""
    if "conformance_device" not in metafunc.fixturenames:
        return
    name = _backend_name(metafunc.config)
    if name is None:
        raise pytest.UsageError(f"conformance tests need {BACKEND_OPTION}=NAME")
    ids = [spec.id for spec in default_registry().backend(name).devices()]
    metafunc.parametrize("conformance_device", ids, ids=ids)


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest) -> Backend:
    """The backend named by ``--hetero-backend``, built through the registry."""
    name = _backend_name(request.config)
    if name is None:
        raise pytest.UsageError(f"conformance tests need {BACKEND_OPTION}=NAME")
    return default_registry().backend(name)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Apply the exclude and xfail filters to conformance tests."""
    excludes = [re.compile(p) for p in config.getoption("--hetero-conformance-exclude")]
    xfails = [re.compile(p) for p in config.getoption("--hetero-conformance-xfail")]
    if not excludes and not xfails:
        return
    kept, deselected = [], []
    for item in items:
        if _is_conformance(item) and any(p.search(item.nodeid) for p in excludes):
            deselected.append(item)
            continue
        if _is_conformance(item) and any(p.search(item.nodeid) for p in xfails):
            item.add_marker(pytest.mark.xfail(reason="--hetero-conformance-xfail", strict=False))
        kept.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
