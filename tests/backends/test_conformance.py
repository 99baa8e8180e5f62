"""The conformance suite against the backend named by --hetero-backend (npu and dummy in CI)."""

from hetero.framework.conformance import BackendConformance


class TestBackendConformance(BackendConformance):
    """Everything comes from the shipped suite."""
