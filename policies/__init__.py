"""Policy files shipped with hetero, read with ``importlib.resources.files("hetero.policies")``."""
