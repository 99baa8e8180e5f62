"""``hetero deploy k8s``: the manifests rendered from the shipped policies validate against
real schemas, and bad input is refused with exit 2, file and line.

Validators (offline, nothing is applied: no cluster runs here):
- core kinds: kubernetes-validate 1.37.0 (PyPI), its bundled strict JSON schemas of
  Kubernetes 1.30.0 and 1.37.0 (unknown fields are errors), on jsonschema 4.x;
- RayCluster: the KubeRay CRD's ``openAPIV3Schema`` (``ray.io/v1``, KubeRay at feeaf72facab,
  copied to tests/data/k8s/ with its licence) with jsonschema's Draft 4 validator, plus a check
  that no field would be pruned (a structural schema drops unknown fields silently);
- ServiceMonitor: its CRD (prometheus-operator's ``monitoring.coreos.com_servicemonitors.yaml``)
  the same way when tests/data/k8s/ holds it; that test is skipped, and says so, where not
  (prometheus-operator's CRD is not in ../shared/data/k8s/ to copy).
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from hetero.framework.cli import main

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "tests" / "data" / "k8s"  # a copy of ../shared/data/k8s (Apache-2.0)
KUBERAY_CRD = SCHEMAS / "kuberay-crds" / "ray.io_rayclusters.yaml"
SERVICE_MONITOR_CRD = SCHEMAS / "monitoring.coreos.com_servicemonitors.yaml"
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
CUSTOM = {"RayCluster", "ServiceMonitor"}


def _render(tmp_path: Path, policy: str | Path, *extra: str) -> list[dict[str, Any]]:
    out = tmp_path / "out"
    assert main(["deploy", "k8s", str(policy), "--out", str(out), *extra]) == 0
    return [yaml.safe_load(path.read_text()) for path in sorted(out.glob("*.yaml"))]


def _validate_core(manifests: list[dict[str, Any]]) -> int:
    checked = 0
    for manifest in manifests:
        if manifest["kind"] in CUSTOM:
            continue
        for release in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(manifest, release, strict=True)
            checked += 1
    return checked


def _crd_schema(path: Path, served: str) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text())
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == served]
    schema: dict[str, Any] = entry["schema"]["openAPIV3Schema"]
    return schema


def _pruned(value: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """Fields of ``value`` a structural schema does not declare (the API server would drop
    them without a word). The root's ``metadata`` is ObjectMeta, which the API server checks
    itself (and kubernetes-validate's strict schemas check for the core kinds)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, dict) and not where:
        value = {k: v for k, v in value.items() if k != "metadata"}
    if isinstance(value, dict):
        declared = schema.get("properties")
        extra = schema.get("additionalProperties")
        found: list[str] = []
        for key, item in value.items():
            if declared is not None and key in declared:
                found += _pruned(item, declared[key], f"{where}.{key}")
            elif isinstance(extra, dict):
                found += _pruned(item, extra, f"{where}.{key}")
            elif declared is not None or extra is None:
                found.append(f"{where}.{key}")
        return found
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [
            p
            for i, item in enumerate(value)
            for p in _pruned(item, schema["items"], f"{where}[{i}]")
        ]
    return []


def _validate_crd(manifest: dict[str, Any], crd: Path, served: str) -> None:
    schema = _crd_schema(crd, served)
    jsonschema.Draft4Validator(schema).validate(manifest)
    assert _pruned(manifest, schema) == []


def _by_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def test_validators_are_the_named_ones() -> None:
    assert version("kubernetes-validate") == "1.37.0"
    assert version("jsonschema").startswith("4.")


def test_default_policy_renders_valid_manifests(tmp_path: Path) -> None:
    manifests = _render(tmp_path, ROOT / "policies" / "default.yaml")
    assert _validate_core(manifests) == 2 * (len(manifests) - 1)
    (deployment,) = _by_kind(manifests, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][:3] == ["serve", "--policy", "/etc/hetero/policy/policy.yaml"]
    # CPU only: no accelerator asked for, no sandbox, no RuntimeClass
    assert not [r for r in container["resources"]["limits"] if "/" in r]
    assert _by_kind(manifests, "RuntimeClass") == []
    assert _by_kind(manifests, "NetworkPolicy") == []
    # the disk tier has its volume, sized from cache.disk.max_bytes (2 GiB) plus headroom
    claims = {c["metadata"]["name"]: c for c in _by_kind(manifests, "PersistentVolumeClaim")}
    assert claims["hetero-features"]["spec"]["resources"]["requests"]["storage"] == "2560Mi"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/var/lib/hetero/.cache/hetero/features"] == "features"
    # the policy is served verbatim
    (config,) = _by_kind(manifests, "ConfigMap")
    assert config["data"]["policy.yaml"] == (ROOT / "policies" / "default.yaml").read_text()


def test_gov_onprem_renders_sandboxes_keys_and_accelerators(tmp_path: Path) -> None:
    manifests = _render(
        tmp_path,
        ROOT / "policies" / "gov-onprem.yaml",
        "--accelerator",
        "nvidia=2",
        "--accelerator",
        "ascend910=1",
        "--partition-storage-class",
        "encrypted-luks",
    )
    assert _validate_core(manifests) == 2 * (len(manifests) - 1)
    runtime_classes = {
        r["metadata"]["name"]: r["handler"] for r in _by_kind(manifests, "RuntimeClass")
    }
    assert runtime_classes == {"kata": "kata", "gvisor": "runsc"}
    deployments = {d["metadata"]["name"]: d for d in _by_kind(manifests, "Deployment")}
    sandbox_runtime = {
        name: d["spec"]["template"]["spec"].get("runtimeClassName")
        for name, d in deployments.items()
        if name.startswith("hetero-sandbox-")
    }
    # id_cards and petition_audio are isolation: vm, public_documents container
    assert sandbox_runtime == {
        "hetero-sandbox-id-card-ocr": "kata",
        "hetero-sandbox-petition-asr": "kata",
        "hetero-sandbox-document-ocr": "gvisor",
    }
    (deny,) = _by_kind(manifests, "NetworkPolicy")
    assert deny["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in deny["spec"] and "egress" not in deny["spec"]
    for name in sandbox_runtime:
        labels = deployments[name]["spec"]["template"]["metadata"]["labels"]
        assert "hetero.dev/sandbox" in labels  # inside the deny-all policy
    server = deployments["hetero"]["spec"]["template"]["spec"]
    (container,) = server["containers"]
    limits = container["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 2 and limits["huawei.com/Ascend910"] == 1
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 2
    # keys come from Secrets: the keyring and signing key as files where the policy reads
    # them, the HSM PIN as the variable it names
    secrets = {v["secret"]["secretName"] for v in server["volumes"] if "secret" in v}
    assert secrets == {"hetero-keyring", "hetero-audit-signing"}
    pin = next(e for e in container["env"] if e["name"] == "HETERO_PKCS11_PIN")
    assert pin["valueFrom"]["secretKeyRef"] == {"name": "hetero-pkcs11", "key": "pin"}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/etc/hetero/keyring.json", "/etc/hetero/audit-signing.pem"} <= mounts
    assert "/var/lib/hetero/partitions/id_cards" in mounts
    claims = {
        c["metadata"]["name"]: c["spec"] for c in _by_kind(manifests, "PersistentVolumeClaim")
    }
    assert claims["hetero-partition-id-cards"]["storageClassName"] == "encrypted-luks"
    # a sandbox reads only its partition, read-only, on the node holding it
    sandbox = deployments["hetero-sandbox-id-card-ocr"]["spec"]["template"]["spec"]
    (data,) = [v for v in sandbox["volumes"] if v["name"] == "data"]
    assert data["persistentVolumeClaim"] == {
        "claimName": "hetero-partition-id-cards",
        "readOnly": True,
    }
    term = sandbox["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "server"


def _ray_policy(tmp_path: Path, extra: str = "") -> Path:
    policy = tmp_path / "cluster.yaml"
    text = (ROOT / "policies" / "default.yaml").read_text()
    text = text.replace("allow: [cpu, npu]", "allow: [cpu, npu, cuda]")
    policy.write_text(text + "\ncluster:\n  engine: ray\n" + extra)
    return policy


def test_ray_mode_renders_a_valid_raycluster(tmp_path: Path) -> None:
    assert KUBERAY_CRD.is_file(), f"KubeRay CRDs not found at {KUBERAY_CRD}"
    manifests = _render(
        tmp_path, _ray_policy(tmp_path), "--accelerator", "nvidia=1", "--workers", "2"
    )
    _validate_core(manifests)
    (cluster,) = _by_kind(manifests, "RayCluster")
    _validate_crd(cluster, KUBERAY_CRD, "v1")
    assert _by_kind(manifests, "Deployment") == []  # the head runs the front door
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    assert [c["name"] for c in head["containers"]] == ["ray-head", "hetero"]
    (worker,) = cluster["spec"]["workerGroupSpecs"]
    assert worker["replicas"] == 2
    assert worker["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    keys = [c["topologyKey"] for c in worker["template"]["spec"]["topologySpreadConstraints"]]
    assert keys == ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
    (service,) = _by_kind(manifests, "Service")
    assert (
        service["spec"]["selector"]
        == cluster["spec"]["headGroupSpec"]["template"]["metadata"]["labels"]
    )


def test_the_pruning_check_sees_an_unknown_field() -> None:
    schema = _crd_schema(KUBERAY_CRD, "v1")
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "x"}}
    cluster["spec"] = {"headGroupSpec": {"template": {"spec": {"containers": []}}}, "headGroup": {}}
    assert _pruned(cluster, schema) == [".spec.headGroup"]


def test_service_monitor_validates_against_its_crd(tmp_path: Path) -> None:
    if not SERVICE_MONITOR_CRD.is_file():
        pytest.skip(f"no ServiceMonitor CRD at {SERVICE_MONITOR_CRD}: only its shape was checked")
    (monitor,) = _by_kind(_render(tmp_path, ROOT / "policies" / "default.yaml"), "ServiceMonitor")
    _validate_crd(monitor, SERVICE_MONITOR_CRD, "v1")


def test_locality_becomes_node_affinity(tmp_path: Path) -> None:
    policy = tmp_path / "local.yaml"
    text = (ROOT / "policies" / "default.yaml").read_text()
    text = text.replace(
        "    model_version: all-minilm-l6-v2@1\n",
        "    model_version: all-minilm-l6-v2@1\n    locality: {zone: eu-west-1a}\n",
    ).replace(
        "    model_version: whisper-tiny.en@1\n",
        "    model_version: whisper-tiny.en@1\n    locality: {site: eu-west, mode: prefer}\n",
    )
    policy.write_text(text)
    manifests = _render(tmp_path, policy)
    _validate_core(manifests)
    (deployment,) = _by_kind(manifests, "Deployment")
    node = deployment["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    required = node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert required == [
        {
            "matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["eu-west-1a"]}
            ]
        }
    ]
    (preferred,) = node["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["preference"]["matchExpressions"][0]["key"] == "topology.kubernetes.io/region"


def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["deploy", "k8s", *argv]) == 2
    return capsys.readouterr().err


def test_bad_input_exits_2_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.yaml"
    assert f"{missing}: policy file not found" in _fails(capsys, str(missing))
    broken = tmp_path / "broken.yaml"
    broken.write_text("version: 1\nstages:\n  a: [\n")
    assert f"{broken}:" in _fails(capsys, str(broken))
    invalid = tmp_path / "invalid.yaml"
    text = (ROOT / "policies" / "default.yaml").read_text()
    invalid.write_text(text.replace("max_batch: 32", "max_batch: -3"))
    line = text.splitlines().index("        max_batch: 32") + 1
    assert f"{invalid}:{line}: stages.text_embed.variants.full.max_batch" in _fails(
        capsys, str(invalid)
    )
    # two stages that must run in different zones cannot share the one pod
    conflict = tmp_path / "conflict.yaml"
    lines = text.replace(
        "    model_version: all-minilm-l6-v2@1\n",
        "    model_version: all-minilm-l6-v2@1\n    locality: {zone: a}\n",
    ).replace(
        "    model_version: whisper-tiny.en@1\n",
        "    model_version: whisper-tiny.en@1\n    locality: {zone: b}\n",
    )
    conflict.write_text(lines)
    # asr comes first in the file, so text_embed is the stage that conflicts
    where = lines.splitlines().index("    locality: {zone: a}") + 1
    message = _fails(capsys, str(conflict))
    assert f"{conflict}:{where}: stages.text_embed.locality.zone: requires zone a, but " in message
    # AMD GPUs for a policy whose devices.deny names rocm
    gov = ROOT / "policies" / "gov-onprem.yaml"
    deny = (gov.read_text().splitlines()).index(
        "  deny: [rocm]                       # the site's accredited hardware list has no AMD GPUs"
    ) + 1
    assert f"{gov}:{deny}: devices.deny" in _fails(capsys, str(gov), "--accelerator", "amd=1")
    assert "unknown kind 'tpu'" in _fails(capsys, str(gov), "--accelerator", "tpu=1")
    # the Ray cluster's manifests for a policy on the embedded engine
    assert "cluster" in _fails(capsys, str(gov), "--engine", "ray")
    assert "--name 'Bad_Name'" in _fails(capsys, str(gov), "--name", "Bad_Name")
    assert "--partition-size '10XB'" in _fails(capsys, str(gov), "--partition-size", "10XB")
    assert "--workers: at least 1" in _fails(capsys, str(gov), "--workers", "0")


def test_paths_outside_home_and_an_api_keys_file(tmp_path: Path) -> None:
    """Writable folders the policy puts outside HOME live on the state volume (a sub-path
    each); the API keys file comes from a Secret; a process-isolated partition has no
    RuntimeClass of its own (the default runtime)."""
    text = (ROOT / "policies" / "gov-onprem.yaml").read_text()
    text = text.replace("path: /var/lib/hetero/audit.log", "path: /srv/audit/audit.log")
    text = text.replace("isolation: container", "isolation: process")
    text = text.replace(
        "sandbox:\n", "server:\n  api_keys_file: /etc/hetero/api-keys.yaml\n\nsandbox:\n"
    )
    policy = tmp_path / "site.yaml"
    policy.write_text(text)
    manifests = _render(tmp_path, policy)
    _validate_core(manifests)
    deployments = {d["metadata"]["name"]: d for d in _by_kind(manifests, "Deployment")}
    (container,) = deployments["hetero"]["spec"]["template"]["spec"]["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/srv/audit"] == {
        "name": "state",
        "mountPath": "/srv/audit",
        "subPath": "srv/audit",
    }
    assert mounts["/etc/hetero/api-keys.yaml"]["subPath"] == "api-keys.yaml"
    assert {r["metadata"]["name"] for r in _by_kind(manifests, "RuntimeClass")} == {"kata"}
    document = deployments["hetero-sandbox-document-ocr"]["spec"]["template"]["spec"]
    assert "runtimeClassName" not in document


def test_out_folder_rerenders_but_keeps_other_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    gov = ROOT / "policies" / "gov-onprem.yaml"
    assert main(["deploy", "k8s", str(gov), "--out", str(out)]) == 0
    many = len(list(out.glob("*.yaml")))
    assert main(["deploy", "k8s", str(ROOT / "policies" / "default.yaml"), "--out", str(out)]) == 0
    fewer = sorted(p.name for p in out.glob("*.yaml"))
    assert len(fewer) < many and not [n for n in fewer if "sandbox" in n]  # no stale objects
    (out / "mine.yaml").write_text("apiVersion: v1\nkind: ConfigMap\n")
    capsys.readouterr()
    assert "mine.yaml, which hetero did not render" in _fails(capsys, str(gov), "--out", str(out))
    assert (out / "mine.yaml").exists()


def test_a_tee_partition_is_refused_not_rendered_weaker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gov = (ROOT / "policies" / "gov-onprem.yaml").read_text()
    first = gov.index("    isolation: vm")
    tee = tmp_path / "tee.yaml"
    tee.write_text(gov[:first] + "    isolation: tee" + gov[first + len("    isolation: vm") :])
    line = gov[:first].count("\n") + 1
    message = _fails(capsys, str(tee))
    assert f"{tee}:{line}: partitions." in message
    assert "isolation: tee" in message
