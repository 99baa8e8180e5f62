"""Schemathesis against the real server (real models): every operation of the OpenAPI document,
bodies generated from the schemas the routes publish, valid and invalid. No answer may be a 5xx
or break the document (status, content type, body schema), and input the schema rules out
must be refused. Schema-valid input may still be refused (400): the schema cannot say that an
image must decode or a clip must hold speech, so schemathesis's positive-data check is off.

Driven through schemathesis's Python API with hypothesis rather than its pytest plugin, whose
lazy fixture needs pytest internals that pytest 9.2 renamed."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
import schemathesis
from conftest import ServerThread, default_with_peer_routes
from fakes import FAKE_STAGES
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from hetero.framework.server import Serving, create_app

EXAMPLES_PER_OPERATION = 12  # 15 operations; chat answers are at most 32 tokens here


def _operations() -> list[tuple[str, str]]:
    """(method, path) of every documented operation (the document needs no model loaded)."""
    runtime = Serving(
        default_with_peer_routes(), stage_models=FAKE_STAGES, cache_directory=tempfile.mkdtemp()
    )
    document = create_app(runtime).openapi()
    return sorted(
        (method.upper(), path) for path, ops in document["paths"].items() for method in ops
    )


@pytest.fixture(scope="module")
def published(real_server: ServerThread) -> Any:
    schema = schemathesis.openapi.from_url(f"{real_server.url}/openapi.json")
    schema.config.base_url = real_server.url
    return schema


@pytest.mark.parametrize(("method", "path"), _operations())
def test_no_operation_answers_5xx_or_off_its_schema(
    published: Any, real_server: ServerThread, method: str, path: str
) -> None:
    operation = published[path][method]

    @given(case=operation.as_strategy())
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: Any) -> None:
        case.call_and_validate(
            base_url=real_server.url, timeout=120, excluded_checks=[positive_data_acceptance]
        )

    fuzz()
