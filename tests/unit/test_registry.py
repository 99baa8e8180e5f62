"""Backend discovery: entry points, priorities, allow-list, autoload switch, broken plugins."""

from __future__ import annotations

import logging
from importlib.metadata import EntryPoint

import pytest

from hetero.framework import registry as registry_module
from hetero.framework.errors import BackendLoadError, BackendUnavailableError, UnknownBackendError
from hetero.framework.registry import BACKENDS_GROUP, Detection, Registry


def fake_entry_points(*pairs: tuple[str, str]) -> object:
    points = [EntryPoint(name=name, value=value, group=BACKENDS_GROUP) for name, value in pairs]

    def entry_points(group: str) -> list[EntryPoint]:
        return points if group == BACKENDS_GROUP else []

    return entry_points


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("HETERO_PLUGINS", raising=False)
    monkeypatch.delenv("HETERO_BACKEND_AUTOLOAD", raising=False)
    return monkeypatch


def test_dummy_plugin_is_discovered_through_its_installed_entry_point(clean_env: object) -> None:
    registry = Registry()
    assert {"npu", "cuda", "rocm", "dummy"} <= set(registry.names())
    backend = registry.backend("dummy")
    assert type(backend).__module__ == "hetero_dummy_backend"
    assert [d.id for d in backend.devices()] == ["dummy:0", "dummy:1"]
    assert registry.backend("dummy") is backend  # instantiated once


def test_available_backends_rank_by_priority(clean_env: object) -> None:
    ranked = [d.name for d in Registry().detections() if d.available]
    assert ranked[:2] == ["npu", "dummy"]  # npu priority 10, dummy -10


def test_broken_plugin_is_logged_with_its_name_and_skipped(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clean_env.setattr(
        registry_module,
        "entry_points",
        fake_entry_points(
            ("npu", "hetero.backends.npu.detect:detect"),
            ("vendorx", "vendorx_backend_that_is_not_installed:detect"),
        ),
    )
    registry = Registry()
    with caplog.at_level(logging.WARNING, logger="hetero.framework.registry"):
        detections = {d.name: d for d in registry.detections()}
    assert detections["npu"].available
    assert not detections["vendorx"].available
    assert "ModuleNotFoundError" in detections["vendorx"].reason
    assert "'vendorx'" in caplog.text and "skipped" in caplog.text
    assert registry.available_backends()[0].name == "npu"


def test_asking_for_a_broken_plugin_by_name_names_entry_point_and_remedy(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setattr(
        registry_module, "entry_points", fake_entry_points(("vendorx", "vendorx_missing:detect"))
    )
    with pytest.raises(BackendLoadError) as caught:
        Registry().backend("vendorx")
    message = str(caught.value)
    assert "hetero.backends:vendorx = vendorx_missing:detect" in message
    assert "Reinstall" in message
    assert isinstance(caught.value, ImportError)


def test_detect_returning_garbage_counts_as_broken(clean_env: pytest.MonkeyPatch) -> None:
    registry = Registry(use_entry_points=False)
    registry.register_backend("odd", lambda: "yes")  # type: ignore[arg-type, return-value]
    assert "not Detection" in registry.detect("odd").reason


def test_allow_list_hides_and_refuses_other_plugins(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("HETERO_PLUGINS", "somethingelse")
    registry = Registry()
    assert "dummy" not in registry.names()
    assert "npu" in registry.names()  # built-ins are not subject to the allow-list
    with pytest.raises(BackendLoadError) as caught:
        registry.backend("dummy")
    assert "HETERO_PLUGINS" in str(caught.value)


def test_allow_list_that_names_the_plugin_lets_it_in(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("HETERO_PLUGINS", "dummy")
    assert "dummy" in Registry().names()


def test_autoload_off_lists_only_builtins_but_loads_a_named_plugin(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("HETERO_BACKEND_AUTOLOAD", "0")
    registry = Registry()
    assert set(registry.names()) == {"npu", "cuda", "rocm", "sim", "vllm"}
    assert registry.backend("dummy").name == "dummy"


def test_autoload_must_parse(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("HETERO_BACKEND_AUTOLOAD", "maybe")
    with pytest.raises(ValueError, match="HETERO_BACKEND_AUTOLOAD"):
        Registry().names()


def test_unknown_and_unavailable_backends(clean_env: object) -> None:
    registry = Registry(use_entry_points=False)
    registry.register_backend("ghost", lambda: Detection.missing("ghost", "no ghost hardware"))
    with pytest.raises(UnknownBackendError, match="registered: ghost"):
        registry.backend("nope")
    with pytest.raises(BackendUnavailableError, match="ghost: no ghost hardware"):
        registry.backend("ghost")


def test_extensions_registered_in_code(clean_env: object) -> None:
    registry = Registry(use_entry_points=False)
    registry.register("stage", "ocr", object)
    assert registry.extensions("stage") == {"ocr": object}
    assert registry.extensions("cache_tier") == {}


def test_a_backend_that_fails_to_start_or_discover_never_stops_start_up(
    clean_env: pytest.MonkeyPatch,
) -> None:
    from hetero.framework.fleet import discover_devices
    from hetero_dummy_backend import DummyBackend

    class ExplodingDiscovery(DummyBackend):
        def _discover(self) -> list:  # type: ignore[type-arg]
            raise OSError("libvendor.so: cannot open shared object file")

    def exploding_factory() -> DummyBackend:
        raise RuntimeError("vendor runtime segfaulted in init")

    registry = Registry(use_entry_points=False)
    registry.register_backend("good", lambda: Detection.found("good", DummyBackend))
    registry.register_backend("nodisc", lambda: Detection.found("nodisc", ExplodingDiscovery))
    registry.register_backend("nostart", lambda: Detection.found("nostart", exploding_factory))
    devices, unavailable = discover_devices(registry)
    assert [d.id for d in devices] == ["dummy:0", "dummy:1"]
    reasons = {d.name: d.reason for d in unavailable}
    assert "libvendor.so" in reasons["nodisc"]
    assert "vendor runtime segfaulted" in reasons["nostart"]
    with pytest.raises(BackendLoadError, match="failed to start"):
        registry.backend("nostart")


def test_plugins_group_registers_and_skips_broken_plugins(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    points = [
        EntryPoint("good", "hetero_dummy_backend.plugin:register", registry_module.PLUGINS_GROUP),
        EntryPoint("bad", "not_installed_plugin:register", registry_module.PLUGINS_GROUP),
    ]
    clean_env.setattr(
        registry_module,
        "entry_points",
        lambda group: points if group == registry_module.PLUGINS_GROUP else [],
    )
    registry = Registry()
    with caplog.at_level(logging.WARNING, logger="hetero.framework.registry"):
        stages = registry.extensions("stage")
    assert set(stages) == {"dummy_echo"}
    assert "'bad'" in caplog.text and "skipped" in caplog.text
