"""Every overlay under ops/kubernetes renders with `kubectl kustomize` and validates offline.

Core kinds are checked with kubernetes-validate (strict: unknown fields are errors); KEDA's
ScaledObject and TriggerAuthentication with the JSON schemas in tests/data/keda (stricter
than KEDA's CRDs: they check the rabbitmq and postgresql scalers' metadata too). A fleet that
cannot work fails the render with a message. The generated files must be current.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from vibey.kube import render
from vibey.kube_config import FleetError, load_fleet

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "ops" / "kubernetes"
OVERLAYS = sorted(p.parent.name for p in (KUBE / "overlays").glob("*/kustomization.yaml"))
KEDA = ROOT / "tests" / "data" / "keda"
K8S_VERSION = kubernetes_validate.latest_version()
KUBECTL_FIX = "kubectl is not installed: install it (apt-get install kubectl) to render overlays"


def kustomize(overlay: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail(KUBECTL_FIX, pytrace=False)
    done = subprocess.run(
        [kubectl, "kustomize", str(overlay)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def keda_validator(kind: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((KEDA / f"{kind.lower()}.schema.json").read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


def validate(obj: dict) -> None:
    if obj["apiVersion"].startswith("keda.sh/"):
        keda_validator(obj["kind"]).validate(obj)
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


_RENDERED: dict[str, list[dict]] = {}


def rendered_overlay(name: str) -> list[dict]:
    if name not in _RENDERED:
        _RENDERED[name] = kustomize(KUBE / "overlays" / name)
    return _RENDERED[name]


@pytest.fixture(params=OVERLAYS)
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, rendered_overlay(request.param)


def test_there_are_overlays_for_both_backends():
    assert {"production", "postgres", "small"} <= set(OVERLAYS)


def test_every_object_validates(rendered):
    _, objects = rendered
    assert len(objects) >= 8
    for obj in objects:
        validate(obj)


def test_the_generated_files_are_current():
    done = subprocess.run(
        [sys.executable, str(KUBE / "render.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def test_pods_run_unprivileged_with_probes_grace_and_secrets(rendered):
    _, objects = rendered
    deployments = by_kind(objects, "Deployment")
    settings = by_kind(objects, "ConfigMap")
    assert any(name.startswith("vibey-settings-") for name in settings)  # hashed, rolled out
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"] + pod.get("initContainers", []):
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            for env in container.get("env", []):
                assert not env["name"].endswith("_URL") or "secretKeyRef" in env["valueFrom"]
        main = pod["containers"][0]
        assert main["readinessProbe"]["exec"]["command"] == ["vibey", "doctor", "--probe"], name
        assert "livenessProbe" in main and "requests" in main["resources"]
        if "worker" in name or "loop-" in name:  # a step may hold its lease 2 h: SIGTERM
            assert pod["terminationGracePeriodSeconds"] >= 7200  # must let it settle


def test_every_worker_pool_and_loop_service_has_a_disruption_budget(rendered):
    _, objects = rendered
    budgets = by_kind(objects, "PodDisruptionBudget")
    for name in by_kind(objects, "Deployment"):
        assert name in budgets, name


def test_production_scales_each_pool_on_its_queues_counting_unacked():
    objects = rendered_overlay("production")
    scalers = by_kind(objects, "ScaledObject")
    build = scalers["vibey-worker-build"]["spec"]
    (trigger,) = build["triggers"]
    assert trigger["metadata"]["queueName"] == "vibey.jobs.build"
    assert trigger["metadata"]["value"] == "2"  # 1 process × 2 threads
    assert trigger["metadata"]["excludeUnacknowledged"] == "false"
    acme = scalers["vibey-worker-acme"]["spec"]["triggers"]
    assert {t["metadata"]["queueName"] for t in acme} == {
        "vibey.jobs.interactive.p.acme",
        "vibey.jobs.build.p.acme",
    }
    (auth,) = by_kind(objects, "TriggerAuthentication").values()
    assert auth["spec"]["secretTargetRef"][0]["key"] == "keda-rabbitmq-host"
    (loop,) = scalers["vibey-loop-claude"]["spec"]["triggers"]
    assert loop["metadata"]["queueName"] == "vibey.runs.claude"
    assert loop["metadata"]["value"] == "2"  # [engines.claude] prefetch
    assert loop["metadata"]["excludeUnacknowledged"] == "false"


def test_a_broken_object_fails_validation():
    """The validators do reject: an unknown field and a wrong scaler mode."""
    objects = render(load_fleet(KUBE / "overlays" / "production" / "fleet.toml"))
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["restart"] = "always"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    scaler = next(o for o in objects if o["kind"] == "ScaledObject")
    scaler["spec"]["triggers"][0]["metadata"]["mode"] = "QueueDepth"
    with pytest.raises(jsonschema.ValidationError):
        validate(scaler)


def broken(tmp_path: Path, fleet: str, settings: str) -> Path:
    (tmp_path / "vibey.toml").write_text(settings, encoding="utf-8")
    (tmp_path / "fleet.toml").write_text(fleet, encoding="utf-8")
    return tmp_path


BOTH = '[[fleet.pools]]\nname = "all"\nlanes = ["interactive", "build"]\n'


@pytest.mark.parametrize(
    ("fleet", "settings", "message"),
    [
        (
            BOTH + '[[fleet.pools]]\nname = "p"\nlanes = ["build"]\nprojects = ["acme"]\n',
            "",
            "pool 'p' serves the dedicated queues of project 'acme', but 'acme' is not in "
            "dedicated_projects",
        ),
        (
            '[[fleet.pools]]\nname = "i"\nlanes = ["interactive"]\n',
            "",
            "no pool consumes the shared 'build' lane",
        ),
        (
            BOTH + '[[fleet.pools]]\nname = "p"\nlanes = ["build"]\nprojects = ["acme"]\n',
            '[queue.rabbitmq]\ndedicated_projects = ["acme"]\n',
            "project 'acme' is dedicated (dedicated_projects in vibey.toml) but no pool "
            "consumes its 'interactive' lane",
        ),
        (BOTH.replace('"all"', '"All"'), "", "must be a DNS label"),
        (BOTH + "threads = 0\n", "", "threads must be a whole number of at least 1"),
        (BOTH + "replicas = 3\n", "", "unknown key 'replicas'"),
        (BOTH, "[queue]\nbackend = 'kafka'\n", "unknown queue backend 'kafka'"),
        (BOTH + '[[fleet.pools]]\nname = "f"\nlanes = ["fast"]\n', "", "unknown lane 'fast'"),
    ],
)
def test_a_fleet_that_cannot_work_fails_the_render_with_a_message(
    tmp_path, fleet, settings, message
):
    overlay = broken(tmp_path, "[fleet]\n" + fleet, settings)
    with pytest.raises(FleetError) as caught:
        load_fleet(overlay / "fleet.toml")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
    done = subprocess.run(
        [sys.executable, str(KUBE / "render.py"), str(overlay)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert not (overlay / "generated").exists()


def test_a_dedicated_project_on_the_postgres_backend_needs_no_queue(tmp_path):
    overlay = broken(
        tmp_path,
        "[fleet]\n" + BOTH + '[[fleet.pools]]\nname = "p"\nlanes = ["build"]\nprojects = ["a"]\n',
        '[queue]\nbackend = "postgres"\n',
    )
    objects = render(load_fleet(overlay / "fleet.toml"))
    scaler = by_kind(objects, "ScaledObject")["vibey-worker-p"]
    (trigger,) = scaler["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    assert "'{a}'::text[]" in trigger["metadata"]["query"]


SERVICE_ENGINE = '[engines.qwen]\nadapter = "aider"\ninvocation = "service"\nprefetch = 3\n'


def test_a_service_engine_renders_its_loop_service(tmp_path):
    overlay = broken(
        tmp_path,
        "[fleet]\n" + BOTH + '[[fleet.engines]]\nid = "qwen"\nmax_replicas = 3\ncpu = "2"\n',
        SERVICE_ENGINE + '[engines.claude]\nadapter = "claude-code"\n',  # a subprocess one
    )
    objects = render(load_fleet(overlay / "fleet.toml"))
    for obj in objects:
        validate(obj)
    deployments = by_kind(objects, "Deployment")
    assert set(deployments) == {"vibey-worker-all", "vibey-loop-qwen"}
    pod = deployments["vibey-loop-qwen"]["spec"]["template"]["spec"]
    (main,) = pod["containers"]
    assert main["args"] == ["loop-service", "--engine=qwen", "--drain-grace=7200"]
    assert pod["terminationGracePeriodSeconds"] == 7200 + 120
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert main["readinessProbe"]["exec"]["command"] == ["vibey", "doctor", "--probe"]
    assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert main["resources"]["requests"]["cpu"] == "2"
    urls = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in main["env"] if "valueFrom" in e
    }
    assert urls == {"VIBEY_PG_URL": "pg-url", "VIBEY_AMQP_URL": "amqp-url"}
    mount = next(m for m in main["volumeMounts"] if m["name"] == "worktrees")
    worker = deployments["vibey-worker-all"]["spec"]["template"]["spec"]
    assert mount in worker["containers"][0]["volumeMounts"]
    claim = next(v for v in pod["volumes"] if v["name"] == "worktrees")
    assert claim["persistentVolumeClaim"]["claimName"] == "vibey-worktrees"
    budget = by_kind(objects, "PodDisruptionBudget")["vibey-loop-qwen"]
    assert budget["spec"]["selector"]["matchLabels"]["vibey.dev/deployment"] == "loop-qwen"
    scaler = by_kind(objects, "ScaledObject")["vibey-loop-qwen"]["spec"]
    assert scaler["maxReplicaCount"] == 3
    (trigger,) = scaler["triggers"]
    assert trigger["metadata"]["queueName"] == "vibey.runs.qwen"
    assert trigger["metadata"]["mode"] == "QueueLength"
    assert trigger["metadata"]["value"] == "3"  # the engine's prefetch


def test_a_loop_service_on_the_postgres_backend_runs_fixed_with_the_broker_url(tmp_path):
    overlay = broken(
        tmp_path, "[fleet]\n" + BOTH, '[queue]\nbackend = "postgres"\n' + SERVICE_ENGINE
    )
    objects = render(load_fleet(overlay / "fleet.toml"))
    deployment = by_kind(objects, "Deployment")["vibey-loop-qwen"]
    assert deployment["spec"]["replicas"] == 1
    assert "vibey-loop-qwen" not in by_kind(objects, "ScaledObject")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert "VIBEY_AMQP_URL" in {e["name"] for e in env}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('id = "claude"\n', "engine 'claude' has no loop service"),
        ('id = "qwen"\nprefetch = 2\n', "prefetch is not a fleet key"),
    ],
)
def test_an_engine_entry_without_a_loop_service_fails_the_render(tmp_path, entry, message):
    overlay = broken(
        tmp_path,
        "[fleet]\n" + BOTH + "[[fleet.engines]]\n" + entry,
        SERVICE_ENGINE + '[engines.claude]\nadapter = "claude-code"\n',
    )
    with pytest.raises(FleetError, match=message):
        load_fleet(overlay / "fleet.toml")
