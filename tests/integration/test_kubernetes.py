"""Every overlay under ops/kubernetes renders with `kubectl kustomize` and validates offline.

Core kinds are checked with kubernetes-validate (strict: unknown fields are errors); KEDA's
ScaledObject and TriggerAuthentication with the JSON schemas in tests/data/keda (stricter
than KEDA's CRDs: they check the rabbitmq and postgresql scalers' metadata too); the
Prometheus Operator's PodMonitor and PrometheusRule with the openAPIV3Schema of its own CRDs
(tests/data/prometheus-operator, v0.93.0's example/prometheus-operator-crd), made strict the
same way (a field the schema does not name is an error). A fleet that cannot work fails the
render with a message. The generated files must be current.
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
PROMETHEUS_OPERATOR = ROOT / "tests" / "data" / "prometheus-operator"
ALERTS = ROOT / "ops" / "monitoring" / "alerts.yaml"
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


def strict(schema: object) -> object:
    """A CRD's openAPIV3Schema with unknown fields rejected wherever it lists the fields
    (unless it says it keeps unknown ones), as the API server's strict field validation."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def crd_validator(kind: str) -> jsonschema.Draft7Validator:
    path = PROMETHEUS_OPERATOR / f"monitoring.coreos.com_{kind.lower()}s.yaml"
    crd = yaml.safe_load(path.read_text(encoding="utf-8"))
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strict(served["schema"]["openAPIV3Schema"])
    assert isinstance(schema, dict)
    schema["properties"]["metadata"] = {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "additionalProperties": False,
    }
    return jsonschema.Draft7Validator(schema)


def validate(obj: dict) -> None:
    if obj["apiVersion"].startswith("keda.sh/"):
        keda_validator(obj["kind"]).validate(obj)
    elif obj["apiVersion"].startswith("monitoring.coreos.com/"):
        crd_validator(obj["kind"]).validate(obj)
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
        if "loop-" in name:  # ready only while it can run its engine
            assert main["readinessProbe"]["httpGet"]["path"] == "/readyz", name
        else:
            assert main["readinessProbe"]["exec"]["command"] == ["vibey", "doctor", "--probe"]
        assert "requests" in main["resources"]
        assert "livenessProbe" in main or name.endswith("-notify"), name
        if "worker" in name or "loop-" in name:  # a step may hold its lease 2 h: SIGTERM
            assert pod["terminationGracePeriodSeconds"] >= 7200  # must let it settle
        # What docs/deploy.md says of every Deployment's pod: a read-only root with an
        # emptyDir /tmp, and an init container waiting for the schema.
        assert {"name": "tmp", "emptyDir": {}} in pod["volumes"], name
        assert main["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"name": "tmp", "mountPath": "/tmp"} in main["volumeMounts"], name
        (init,) = pod["initContainers"]
        assert init["command"][-1] == "until vibey doctor --probe; do sleep 5; done", name
    (job,) = by_kind(objects, "Job").values()
    job_pod = job["spec"]["template"]["spec"]
    assert {"name": "tmp", "emptyDir": {}} in job_pod["volumes"]


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
        (BOTH, "[queue]\nbackend = 'kafka'\n", "backend 'kafka' is not one of rabbitmq, postgres"),
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
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
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


def test_keda_scaled_deployments_leave_replicas_to_keda_with_a_fallback(rendered):
    _, objects = rendered
    scalers = by_kind(objects, "ScaledObject")
    for name, deployment in by_kind(objects, "Deployment").items():
        if name in scalers:  # an apply must not reset what KEDA scaled
            assert "replicas" not in deployment["spec"], name
            fallback = scalers[name]["spec"]["fallback"]
            assert fallback["replicas"] >= 1  # a dead management API never scales to zero
            assert fallback["replicas"] <= scalers[name]["spec"]["maxReplicaCount"]
        else:
            assert deployment["spec"]["replicas"] >= 1, name


def test_no_worker_pool_prefetches_more_than_its_threads(rendered):
    overlay, objects = rendered
    # What the overlay's own vibey.toml asks for (None: as many as the threads).
    configured = load_fleet(KUBE / "overlays" / overlay / "fleet.toml").settings
    asked = configured.queue.rabbitmq.prefetch
    for name, deployment in by_kind(objects, "Deployment").items():
        if "-worker-" not in name:
            continue
        (main,) = deployment["spec"]["template"]["spec"]["containers"]
        threads = int(next(a for a in main["args"] if a.startswith("--threads=")).split("=")[1])
        env = {e["name"]: e.get("value") for e in main["env"]}
        if overlay == "postgres":
            assert "VIBEY_QUEUE_PREFETCH" not in env
        else:  # the settings' prefetch, cut to the pool's threads
            assert int(env["VIBEY_QUEUE_PREFETCH"]) == min(asked or threads, threads), name
    if overlay == "production":  # prefetch 4 in vibey.toml; the BUILD pool runs 2 threads
        build = by_kind(objects, "Deployment")["vibey-worker-build"]
        (main,) = build["spec"]["template"]["spec"]["containers"]
        assert {"name": "VIBEY_QUEUE_PREFETCH", "value": "2"} in main["env"]


def test_the_reconcilers_spread_over_nodes():
    objects = rendered_overlay("production")
    pod = by_kind(objects, "Deployment")["vibey-reconciler"]["spec"]["template"]["spec"]
    keys = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
    assert keys["kubernetes.io/hostname"]["maxSkew"] == 1
    assert keys["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"
    assert "topology.kubernetes.io/zone" in keys


def test_a_readwriteonce_volume_binds_every_pod_that_mounts_it_to_one_node():
    objects = rendered_overlay("small")
    (claim,) = by_kind(objects, "PersistentVolumeClaim").values()
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    mounting = [
        d
        for d in by_kind(objects, "Deployment").values()
        if any(v["name"] == "worktrees" for v in d["spec"]["template"]["spec"]["volumes"])
    ]
    assert mounting
    for deployment in mounting:
        template = deployment["spec"]["template"]
        (term,) = template["spec"]["affinity"]["podAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        selected = term["labelSelector"]["matchLabels"]
        assert selected.items() <= template["metadata"]["labels"].items()  # finds its peers
    for deployment in by_kind(rendered_overlay("production"), "Deployment").values():
        assert "affinity" not in deployment["spec"]["template"]["spec"]  # ReadWriteMany


def test_the_migrations_job_is_named_per_release():
    objects = rendered_overlay("production")
    (job,) = by_kind(objects, "Job").values()
    assert job["metadata"]["name"] == "vibey-migrate-0-1-0"  # images: newTag 0.1.0
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["migrate"]
    fleet = load_fleet(KUBE / "overlays" / "production" / "fleet.toml")
    names = {
        release: next(o for o in render(fleet, release=release) if o["kind"] == "Job")
        for release in ("0.2.0", "1.0.0-rc.1", "sha256:ABC")
    }
    assert [j["metadata"]["name"] for j in names.values()] == [
        "vibey-migrate-0-2-0",
        "vibey-migrate-1-0-0-rc-1",
        "vibey-migrate-sha256-abc",
    ]


def test_the_console_runs_behind_a_service_with_its_secrets_from_a_secret():
    objects = rendered_overlay("production")
    console = by_kind(objects, "Deployment")["vibey-console"]
    assert console["spec"]["replicas"] == 2
    (main,) = console["spec"]["template"]["spec"]["containers"]
    assert main["args"] == ["console"]
    env = {e["name"]: e for e in main["env"]}
    assert env["VIBEY_CONSOLE_HOST"]["value"] == "0.0.0.0"
    assert env["VIBEY_CONSOLE_ALLOW_REMOTE"]["value"] == "1"
    for variable, key in (
        ("VIBEY_CONSOLE_PASSWORD_HASH", "password-hash"),
        ("VIBEY_CONSOLE_TOKEN_HASH", "token-hash"),
    ):
        ref = env[variable]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("vibey-console", key)
    service = by_kind(objects, "Service")["vibey-console"]["spec"]
    assert service["type"] == "ClusterIP"
    assert service["selector"].items() <= console["spec"]["template"]["metadata"]["labels"].items()
    (port,) = service["ports"]
    assert port["targetPort"] == "http" and main["ports"] == [
        {"name": "http", "containerPort": 8377}
    ]
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert "vibey-console" in by_kind(objects, "PodDisruptionBudget")


def test_notify_runs_when_webhooks_are_set_with_their_secrets_from_a_secret():
    objects = rendered_overlay("production")
    notify = by_kind(objects, "Deployment")["vibey-notify"]
    (main,) = notify["spec"]["template"]["spec"]["containers"]
    assert main["args"] == ["notify"]
    for deployment in by_kind(objects, "Deployment").values():  # every pod loads the settings
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            assert {"secretRef": {"name": "vibey-notify", "optional": True}} in container["envFrom"]
    assert "vibey-notify" not in by_kind(rendered_overlay("small"), "Deployment")


def test_the_prometheus_operator_objects_carry_the_alert_rules():
    objects = rendered_overlay("production")
    (rule,) = by_kind(objects, "PrometheusRule").values()
    alerts = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    assert rule["spec"]["groups"] == alerts["groups"]
    (monitor,) = by_kind(objects, "PodMonitor").values()
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    selected = monitor["spec"]["selector"]["matchLabels"]
    workers = [d for n, d in by_kind(objects, "Deployment").items() if "-worker-" in n]
    for deployment in workers:
        assert selected.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_a_broken_prometheus_operator_object_fails_validation():
    objects = rendered_overlay("production")
    rule = json.loads(json.dumps(by_kind(objects, "PrometheusRule")["vibey"]))
    rule["spec"]["groups"][0]["rules"][0]["severity"] = "critical"  # belongs under labels
    with pytest.raises(jsonschema.ValidationError):
        validate(rule)
    monitor = json.loads(json.dumps(by_kind(objects, "PodMonitor")["vibey"]))
    monitor["spec"]["podMetricsEndpoints"][0]["interval"] = "soon"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor)


def test_the_pods_grace_is_the_drain_grace_the_processes_read(rendered):
    """One function for both: `vibey worker` waits ``drain_grace`` for its steps and the
    pod gets that plus the margin; a loop service's ``--drain-grace`` is the same as the
    default `vibey loop-service` computes."""
    from vibey.wiring import drain_grace, service_drain_grace, worker_config

    overlay, objects = rendered
    fleet = load_fleet(KUBE / "overlays" / overlay / "fleet.toml")
    grace = int(drain_grace(fleet.settings).total_seconds())
    for name, deployment in by_kind(objects, "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        if "-worker-" in name:
            assert pod["terminationGracePeriodSeconds"] == grace + fleet.grace_margin_seconds
        if "-loop-" in name:
            engine = name.removeprefix("vibey-loop-")
            (spec,) = fleet.settings.roster([engine])
            drain = int(service_drain_grace(fleet.settings, spec).total_seconds())
            assert f"--drain-grace={drain}" in pod["containers"][0]["args"]
            assert pod["terminationGracePeriodSeconds"] == drain + fleet.grace_margin_seconds
    if fleet.backend == "rabbitmq":
        env = {"VIBEY_PG_URL": "postgresql://x@h/d", "VIBEY_AMQP_URL": "amqp://h/"}
        config = worker_config(_with_urls(fleet.settings, env))
        assert config.drain_grace.total_seconds() == grace


def _with_urls(settings, env):
    from vibey.settings import replace

    database = replace(settings.database, url=env["VIBEY_PG_URL"])
    bus = replace(settings.bus, amqp_url=env["VIBEY_AMQP_URL"])
    return replace(settings, database=database, bus=bus)
