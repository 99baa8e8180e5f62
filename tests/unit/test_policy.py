"""Policy loading: shipped files validate; every kind of bad input names file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from hetero.framework.errors import (
    PolicyNotFoundError,
    PolicySyntaxError,
    PolicyValidationError,
)
from hetero.framework.policy import PolicyStore, load_policy, load_policy_text

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ["default.yaml", "gov-onprem.yaml", "sim/8xa100.yaml", "sim/mixed-fleet.yaml"]
DEFAULT = (REPO / "policies" / "default.yaml").read_text()

MINIMAL = """\
version: 1
stages:
  ocr:
    modality: image
    variants:
      full:
        flops_per_item: 8 GFLOPS
        bytes_per_item: 120 MB
        max_batch: 4
      light:
        flops_per_item: 2 GFLOPS
        bytes_per_item: 40 MB
        max_batch: 4
  llm:
    modality: text
    variants:
      full: {flops_per_item: 1e9, bytes_per_item: 1.0e9}
pipelines:
  read:
    steps:
      - stage: ocr
      - stage: llm
routes:
  /v1/read: read
qos:
  default_class: standard
  classes:
    standard: {weight: 1, sla_tier: silver}
sla_tiers:
  silver: {deadline_ms: 1000}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    return path


def error_for(tmp_path: Path, text: str) -> PolicyValidationError:
    path = write(tmp_path, text)
    with pytest.raises(PolicyValidationError) as caught:
        load_policy(path)
    return caught.value


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_policies_validate(name: str) -> None:
    policy = load_policy(REPO / "policies" / name)
    assert policy.spec.stages
    for route, target in policy.spec.routes.items():
        assert policy.pipeline_for_route(route).name == target


def test_builtin_default_is_read_from_the_package() -> None:
    policy = load_policy("builtin:default")
    assert policy.spec.name == "default"
    assert policy.source == "builtin:default"


def test_minimal_policy_parses_quantities_and_chains_steps(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, MINIMAL))
    full = policy.spec.stages["ocr"].variants["full"]
    assert full.flops_per_item == 8e9
    assert full.bytes_per_item == 120e6
    assert policy.spec.stages["llm"].variants["full"].flops_per_item == 1e9
    read = policy.pipelines["read"]
    assert read.order == ("ocr", "llm")
    assert read.steps["llm"].after == ("ocr",)


def test_snapshot_is_immutable(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, MINIMAL))
    with pytest.raises(ValidationError, match="frozen"):
        policy.spec.stages["ocr"].modality = "audio"  # type: ignore[misc]
    with pytest.raises(TypeError):
        policy.spec.stages["new"] = policy.spec.stages["ocr"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        policy.spec.routes.clear()  # type: ignore[attr-defined]


def test_negative_batch_names_file_line_and_key_path(tmp_path: Path) -> None:
    text = MINIMAL.replace("        max_batch: 4\n  llm:", "        max_batch: -3\n  llm:")
    err = error_for(tmp_path, text)
    assert str(err) == (
        f"{tmp_path / 'x.yaml'}:13: stages.ocr.variants.light.max_batch: "
        "expected a positive integer, got -3"
    )
    assert err.line == 13
    assert err.key_path == "stages.ocr.variants.light.max_batch"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyNotFoundError) as caught:
        load_policy(tmp_path / "absent.yaml")
    assert str(caught.value) == f"{tmp_path / 'absent.yaml'}: policy file not found"


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    text = MINIMAL.replace("routes:\n", "routes:\n  - [unclosed\n")
    with pytest.raises(PolicySyntaxError) as caught:
        load_policy(write(tmp_path, text))
    assert caught.value.line is not None
    assert caught.value.line in (24, 25)  # the bracket opens on 24; YAML notices on 25
    assert "YAML syntax error" in str(caught.value)


@pytest.mark.parametrize(
    ("old", "new", "line", "key_path", "problem"),
    [
        (
            "    max_batch: 4\n  llm",
            "    max_batch: many\n  llm",
            13,
            "stages.ocr.variants.light.max_batch",
            "expected an integer, got 'many'",
        ),
        (
            "  ocr:\n    modality: image\n",
            "  ocr:\n    modality: image\n    modalty: x\n",
            5,
            "stages.ocr.modalty",
            "unknown key 'modalty'; did you mean 'modality'?",
        ),
        ("version: 1\n", "version: 1\ncolour: blue\n", 2, "colour", "unknown key 'colour'"),
        (
            "modality: text",
            "modality: smell",
            15,
            "stages.llm.modality",
            "expected 'text', 'image', 'audio', 'video' or 'embedding', got 'smell'",
        ),
        (
            "weight: 1,",
            "weight: -1,",
            28,
            "qos.classes.standard.weight",
            "expected a positive number, got -1",
        ),
        (
            "/v1/read: read",
            "/v1/read: reed",
            24,
            "routes./v1/read",
            "no pipeline or stage named 'reed'",
        ),
        (
            "      - stage: llm\n",
            "      - stage: lllm\n",
            22,
            "pipelines.read.steps[1].stage",
            "unknown stage 'lllm' (defined: llm, ocr)",
        ),
        (
            "sla_tier: silver}",
            "sla_tier: gold}",
            28,
            "qos.classes.standard.sla_tier",
            "unknown SLA tier 'gold' (defined: silver)",
        ),
        (
            "bytes_per_item: 120 MB",
            "bytes_per_item: 120 parsecs",
            8,
            "stages.ocr.variants.full.bytes_per_item",
            "expected a number, got '120 parsecs'",
        ),
        (
            "  ocr:\n    modality: image\n",
            "  ocr:\n    modality: image\n    modality: text\n",
            5,
            "stages.ocr.modality",
            "duplicate key",
        ),
        (
            "  ocr:\n    modality: image\n",
            "  ocr:\n    modality: image\n    rollout: {strategy: canary, canary_share: 1.5}\n",
            5,
            "stages.ocr.rollout.canary_share",
            "1.5",
        ),
        (
            "  ocr:\n    modality: image\n",
            "  ocr:\n    modality: image\n    rollout:\n      strategy: blue_green\n",
            6,
            "stages.ocr.rollout.strategy",
            "expected 'all_at_once' or 'canary', got 'blue_green'",
        ),
        (
            "  ocr:\n    modality: image\n",
            "  ocr:\n    modality: image\n    rollout:\n      canary_seconds: 30\n",
            6,
            "stages.ocr.rollout.canary_seconds",
            "unknown key 'canary_seconds'",
        ),
    ],
)
def test_bad_values_name_line_and_key(
    tmp_path: Path, old: str, new: str, line: int, key_path: str, problem: str
) -> None:
    assert old in MINIMAL
    err = error_for(tmp_path, MINIMAL.replace(old, new, 1))
    assert (err.line, err.key_path) == (line, key_path)
    assert problem in err.problem


def test_unknown_cipher(tmp_path: Path) -> None:
    text = MINIMAL + (
        "partitions:\n  ids:\n    modality: image\n    classification: secret\n"
        "    cipher: DES\n    key: file:ids\n    isolation: vm\n    roles: [officer]\n"
    )
    err = error_for(tmp_path, text)
    assert err.key_path == "partitions.ids.cipher"
    assert err.line == 35
    assert err.problem == "expected 'AES-256-GCM' or 'SM4-GCM', got 'DES'"


def test_cyclic_pipeline(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        "      - stage: ocr\n      - stage: llm\n",
        "      - stage: ocr\n        after: [llm]\n      - stage: llm\n",
    )
    err = error_for(tmp_path, text)
    assert err.key_path == "pipelines.read.steps"
    assert err.line == 20
    assert "cycle" in err.problem
    assert "ocr" in err.problem and "llm" in err.problem


def test_route_to_a_stage_makes_a_one_step_pipeline(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, MINIMAL.replace("/v1/read: read", "/v1/read: ocr")))
    assert policy.pipeline_for_route("/v1/read").order == ("ocr",)


def test_all_problems_are_reported(tmp_path: Path) -> None:
    text = MINIMAL.replace("max_batch: 4", "max_batch: 0").replace("weight: 1", "weight: x")
    err = error_for(tmp_path, text)
    assert err.line == 9
    assert len(err.more) == 2
    assert ":13: " in err.more[0] and ":28: " in err.more[1]


def test_non_mapping_document(tmp_path: Path) -> None:
    err = error_for(tmp_path, "- just\n- a list\n")
    assert err.line == 1
    assert "mapping" in err.problem


def test_reload_swaps_atomically_and_a_failed_reload_keeps_the_old(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    store = PolicyStore(load_policy(path))
    first = store.current
    path.write_text(MINIMAL.replace("deadline_ms: 1000", "deadline_ms: 250"))
    second = store.reload()
    assert store.current is second
    assert second.spec.sla_tiers["silver"].deadline_ms == 250
    assert first.spec.sla_tiers["silver"].deadline_ms == 1000  # in-flight snapshot unchanged
    path.write_text(MINIMAL.replace("deadline_ms: 1000", "deadline_ms: -1"))
    with pytest.raises(PolicyValidationError):
        store.reload()
    assert store.current is second


def test_text_loader_names_its_source() -> None:
    with pytest.raises(PolicyValidationError) as caught:
        load_policy_text(DEFAULT.replace("version: 1", "version: 2"), "inline")
    assert str(caught.value).startswith("inline:")


def test_aging_off_with_unequal_weights_would_starve_and_is_refused(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        "    standard: {weight: 1, sla_tier: silver}",
        "    standard: {weight: 1, sla_tier: silver}\n    urgent: {weight: 5, sla_tier: silver}",
    ).replace("  default_class: standard", "  default_class: standard\n  aging_per_second: 0")
    err = error_for(tmp_path, text)
    assert err.key_path == "qos.aging_per_second"
    assert "lowest class can starve" in err.problem


def test_equal_weights_are_allowed_and_mean_first_come_first_served(tmp_path: Path) -> None:
    from hetero.framework.scheduler.queues import QueueClass, StageQueue
    from hetero.framework.scheduler.tasks import StageTask

    text = MINIMAL.replace(
        "    standard: {weight: 1, sla_tier: silver}",
        "    standard: {weight: 1, sla_tier: silver}\n    other: {weight: 1, sla_tier: silver}",
    )
    policy = load_policy(write(tmp_path, text))
    classes = {n: QueueClass(c.weight, c.queue_bound) for n, c in policy.spec.qos.classes.items()}
    queue = StageQueue("ocr", classes, policy.spec.qos.aging_per_second)
    for index, qos in enumerate(["other", "standard", "other"]):
        queue.push(StageTask("r", "ocr", "ocr", "full", qos, arrival=float(index), deadline=9.0))
    assert [queue.pop().arrival for _ in range(3)] == [0.0, 1.0, 2.0]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("max_qos_class", "platinum", "unknown QoS class"), ("sla_tier", "diamond", "unknown SLA")],
)
def test_an_api_key_naming_an_unknown_class_or_tier_is_refused_at_its_line(
    field: str, value: str, message: str
) -> None:
    text = (Path(__file__).parents[2] / "policies" / "default.yaml").read_text()
    text += f"\nserver:\n  api_keys:\n    - {{name: a, sha256: {'a' * 64}, {field}: {value}}}\n"
    with pytest.raises(PolicyValidationError, match=message) as caught:
        load_policy_text(text, "keys.yaml")
    assert f"server.api_keys[0].{field}" in str(caught.value) and "keys.yaml:" in str(caught.value)
