"""The backend conformance suite, shipped inside the package for vendors.

A vendor proves a backend plugin with two lines in a test module named
``test_conformance*.py``::

    from hetero.framework.conformance import BackendConformance

    class TestMyBackend(BackendConformance):
        pass

and ``pytest --hetero-backend=NAME``. The pytest plugin (entry point ``pytest11``) is inert
without that option: it adds options and skips collecting ``test_conformance*`` modules.
"""

import pytest

pytest.register_assert_rewrite("hetero.framework.conformance.suite")

from hetero.framework.conformance.suite import BackendConformance  # noqa: E402

__all__ = ["BackendConformance"]
