"""A fleet's Kubernetes objects, rendered from ``fleet.toml`` and the overlay's ``vibey.toml``.

:func:`render` returns the objects the overlay's ``generated/fleet.yaml`` holds: the
migrations Job of the release (``<name>-migrate-<release>``: a new image tag is a new Job,
so nothing has to be deleted by hand); per worker pool a Deployment, a PodDisruptionBudget
and (with ``keda``) a ScaledObject; per engine the settings run with ``invocation =
"service"`` a ``vibey loop-service`` Deployment, its PodDisruptionBudget and (with ``keda``,
on rabbitmq) a ScaledObject on ``<prefix>.runs.<id>`` (``value`` the engine's prefetch,
unacknowledged runs counted); with ``[fleet.console]`` the console's Deployment, Service and
PodDisruptionBudget; with webhooks in the settings ``vibey notify``'s Deployment and
PodDisruptionBudget; the TriggerAuthentication; the worktrees PersistentVolumeClaim. The
static parts (ServiceAccount, the reconciler) live in ``ops/kubernetes/base``. Every pod runs
the image named ``vibey`` (the overlay's ``images:`` sets it), reads its settings from the
``vibey-settings`` ConfigMap and its URLs from the fleet's Secret, and never as root.

A Deployment KEDA scales has no ``replicas`` (an apply would reset the pool to it); every
ScaledObject has a ``fallback`` (a scaler that keeps failing, a dead management API, holds the
pool at its fallback replicas instead of scaling it to zero). A worker pool's prefetch is
never above its threads (``VIBEY_QUEUE_PREFETCH`` per pool). On a ReadWriteOnce worktrees
volume every pod that mounts it is bound to the node of the others (pod affinity), so a
surging rollout's new pod lands where the volume is attached.

KEDA triggers (seed 000 §12): on ``rabbitmq`` the RabbitMQ scaler over the management API
(``protocol: http``, ``mode: QueueLength``, ``value`` the pool's processes × threads,
unacknowledged deliveries counted, so a pod running a two-hour step is not scaled in under
it); on ``postgres`` the postgresql scaler with :func:`store.drive.scaler_query`, the rows
the drive loop's claim would take plus the leased ones.
"""

from __future__ import annotations

from typing import Any

from actors.runs_topology import RunsTopology
from actors.topology import QueueNames
from store.drive import Work, build_kinds, scaler_query
from vibey.kube_config import Console, Engine, Fleet, Pool, Resources
from vibey.wiring import load_registry, service_drain_grace

Obj = dict[str, Any]
IMAGE = "vibey"
SETTINGS_CONFIGMAP = "vibey-settings"
SETTINGS_PATH = "/etc/vibey"
WORKTREES_PATH = "/work"
UID = 10001
KEDA_RABBITMQ_HOST_KEY = "keda-rabbitmq-host"
KEDA_PG_CONNECTION_KEY = "keda-pg-connection"
FALLBACK_FAILURES = 3  # failed scaler reads in a row before KEDA holds the fallback replicas
WORKTREES_LABEL = "vibey.dev/worktrees"
HOSTNAME = "kubernetes.io/hostname"


def render(fleet: Fleet, *, release: str = "dev") -> list[Obj]:
    """Every generated object; ``release`` (the image tag) names the migrations Job."""
    objects: list[Obj] = [_worktrees(fleet), _migrate_job(fleet, release)]
    if fleet.keda:
        objects.append(_trigger_auth(fleet))
    for pool in fleet.pools:
        objects += [_pool_deployment(fleet, pool), _pdb(fleet, f"worker-{pool.name}")]
        if fleet.keda:
            objects.append(_pool_scaler(fleet, pool))
    for engine in fleet.engines:
        name = f"loop-{engine.id}"
        objects += [_engine_deployment(fleet, engine), _pdb(fleet, name, "loop-service")]
        if _scales_engines(fleet):
            objects.append(_engine_scaler(fleet, engine))
    if fleet.console is not None:
        objects += [
            _console_deployment(fleet, fleet.console),
            _console_service(fleet, fleet.console),
            _pdb(fleet, "console", "console"),
        ]
    if fleet.settings.webhooks:
        objects += [_notify_deployment(fleet), _pdb(fleet, "notify", "notify")]
    return objects


def release_label(release: str) -> str:
    """``release`` as the tail of an object name: lower case, [a-z0-9-], at most 30."""
    cleaned = "".join(c if c.isalnum() else "-" for c in release.lower()).strip("-")
    return cleaned[:30].strip("-") or "dev"


def _meta(fleet: Fleet, name: str, component: str, **extra: Any) -> Obj:
    return {
        "name": f"{fleet.name}-{name}",
        "labels": _labels(fleet, component, name),
        **extra,
    }


def _labels(fleet: Fleet, component: str, name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "vibey",
        "app.kubernetes.io/instance": fleet.name,
        "app.kubernetes.io/component": component,
        "vibey.dev/deployment": name,
    }


def _worktrees(fleet: Fleet) -> Obj:
    spec: Obj = {
        "accessModes": [fleet.worktrees.access_mode],
        "resources": {"requests": {"storage": fleet.worktrees.size}},
    }
    if fleet.worktrees.storage_class is not None:
        spec["storageClassName"] = fleet.worktrees.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(fleet, "worktrees", "storage"),
        "spec": spec,
    }


def _trigger_auth(fleet: Fleet) -> Obj:
    parameter, key = (
        ("host", KEDA_RABBITMQ_HOST_KEY)
        if fleet.backend == "rabbitmq"
        else ("connection", KEDA_PG_CONNECTION_KEY)
    )
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "TriggerAuthentication",
        "metadata": _meta(fleet, "keda", "autoscaling"),
        "spec": {"secretTargetRef": [{"parameter": parameter, "name": fleet.secret, "key": key}]},
    }


def _worker_args(fleet: Fleet, pool: Pool) -> list[str]:
    args = [
        "worker",
        f"--processes={pool.processes}",
        f"--threads={pool.threads}",
        f"--lanes={','.join(pool.lanes)}",
    ]
    return args + [f"--project={project}" for project in pool.projects]


def _pool_deployment(fleet: Fleet, pool: Pool) -> Obj:
    name = f"worker-{pool.name}"
    replicas = None if fleet.keda else max(pool.min_replicas, 1)  # KEDA owns the count
    container = _container(fleet, "worker", _worker_args(fleet, pool), pool.resources)
    if fleet.backend == "rabbitmq":
        container["env"].append(
            {"name": "VIBEY_QUEUE_PREFETCH", "value": str(pool.prefetch(fleet.settings))}
        )
    return _deployment(fleet, name, "worker", container, replicas=replicas)


def _scales_engines(fleet: Fleet) -> bool:
    """KEDA scales a loop service on its run queue: the TriggerAuthentication holds the
    RabbitMQ management host only on the rabbitmq backend (elsewhere: fixed replicas)."""
    return fleet.keda and fleet.backend == "rabbitmq"


def _engine_deployment(fleet: Fleet, engine: Engine) -> Obj:
    """``vibey loop-service``: on SIGTERM its runs get the longest of the leases and the
    engine's run time to finish (``--drain-grace``), and the pod that long plus the margin."""
    (spec,) = fleet.settings.roster([engine.id])
    drain = int(service_drain_grace(fleet.settings, spec).total_seconds() + 0.999)
    args = ["loop-service", f"--engine={engine.id}", f"--drain-grace={drain}"]
    container = _container(fleet, "loop-service", args, engine.resources)
    # Ready only while it can run its engine (its binary is in the image) and is live.
    container["readinessProbe"] = {
        "httpGet": {"path": "/readyz", "port": "metrics"},
        "periodSeconds": 15,
        "timeoutSeconds": 5,
        "failureThreshold": 2,
    }
    replicas = None if _scales_engines(fleet) else max(engine.min_replicas, 1)
    deployment = _deployment(
        fleet, f"loop-{engine.id}", "loop-service", container, replicas=replicas
    )
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = (
        drain + fleet.grace_margin_seconds
    )
    return deployment


def _deployment(
    fleet: Fleet,
    name: str,
    component: str,
    container: Obj,
    *,
    replicas: int | None,
    worktrees: bool = True,
    metrics: bool = True,
) -> Obj:
    """``replicas`` None: KEDA scales it, so the field is left out (an apply keeps the
    count KEDA set)."""
    labels = _labels(fleet, component, name)
    if worktrees:
        labels[WORKTREES_LABEL] = fleet.name
    spec: Obj = {
        "selector": {"matchLabels": {"vibey.dev/deployment": name, **_instance(fleet)}},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0}},
        "template": {
            "metadata": {"labels": labels},
            "spec": _pod_spec(fleet, container, worktrees=worktrees),
        },
    }
    if metrics:
        spec["template"]["metadata"]["annotations"] = {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(fleet.metrics_port),
        }
    if replicas is not None:
        spec = {"replicas": replicas, **spec}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(fleet, name, component),
        "spec": spec,
    }


def _instance(fleet: Fleet) -> dict[str, str]:
    return {"app.kubernetes.io/instance": fleet.name}


def _pod_spec(fleet: Fleet, container: Obj, *, worktrees: bool = True) -> Obj:
    volumes: list[Obj] = [{"name": "settings", "configMap": {"name": SETTINGS_CONFIGMAP}}]
    if worktrees:
        claim = {"claimName": f"{fleet.name}-worktrees"}
        volumes.append({"name": "worktrees", "persistentVolumeClaim": claim})
    volumes.append({"name": "tmp", "emptyDir": {}})
    spec: Obj = {
        "serviceAccountName": fleet.name,
        "automountServiceAccountToken": False,
        # SIGTERM drains: running steps settle first (vibey.wiring.drain_grace, the grace
        # `vibey worker` itself waits), plus the margin for the rest of the shutdown.
        "terminationGracePeriodSeconds": fleet.drain_grace_seconds + fleet.grace_margin_seconds,
        "securityContext": _pod_security(),
        "initContainers": [_wait_for_schema(fleet, worktrees=worktrees)],
        "containers": [container],
        "volumes": volumes,
    }
    if worktrees and fleet.worktrees.access_mode == "ReadWriteOnce":
        # A ReadWriteOnce volume attaches to one node: every pod mounting it goes there.
        term = {
            "labelSelector": {"matchLabels": {WORKTREES_LABEL: fleet.name, **_instance(fleet)}},
            "topologyKey": HOSTNAME,
        }
        spec["affinity"] = {
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
        }
    return spec


def _pod_security() -> Obj:
    return {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": UID,
        "fsGroup": UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _env(fleet: Fleet) -> list[Obj]:
    def secret(name: str, key: str) -> Obj:
        return {"name": name, "valueFrom": {"secretKeyRef": {"name": fleet.secret, "key": key}}}

    env = [
        {"name": "VIBEY_CONFIG", "value": f"{SETTINGS_PATH}/vibey.toml"},
        {"name": "VIBEY_ENGINE_WORKSPACE", "value": WORKTREES_PATH},
        {"name": "VIBEY_METRICS_PORT", "value": str(fleet.metrics_port)},
        secret("VIBEY_PG_URL", "pg-url"),
    ]
    if fleet.backend == "rabbitmq" or fleet.engines or fleet.settings.webhooks:
        env.append(secret("VIBEY_AMQP_URL", "amqp-url"))  # loop services, notify ride on it
    return env


def _env_from(fleet: Fleet) -> list[Obj]:
    """The webhooks' secrets (keys ``VIBEY_NOTIFY_WEBHOOK_<NAME>_SECRET``): every pod loads
    the settings, and a webhook's settings need its secret."""
    return [{"secretRef": {"name": fleet.notify_secret, "optional": True}}]


def _mounts(*, worktrees: bool = True) -> list[Obj]:
    mounts: list[Obj] = [{"name": "settings", "mountPath": SETTINGS_PATH, "readOnly": True}]
    if worktrees:
        mounts.append({"name": "worktrees", "mountPath": WORKTREES_PATH})
    return [*mounts, {"name": "tmp", "mountPath": "/tmp"}]


def _security() -> Obj:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _wait_for_schema(fleet: Fleet, *, worktrees: bool = True) -> Obj:
    """Hold the pod until the migrations Job has run (``vibey doctor --probe`` is false while
    a migration this code ships is pending, the schema no longer serves this code, or a
    service does not answer)."""
    return {
        "name": "wait-for-schema",
        "image": IMAGE,
        "command": ["sh", "-c", "until vibey doctor --probe; do sleep 5; done"],
        "env": _env(fleet),
        "envFrom": _env_from(fleet),
        "volumeMounts": _mounts(worktrees=worktrees),
        "securityContext": _security(),
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
    }


def _container(
    fleet: Fleet, name: str, args: list[str], resources: Resources, *, worktrees: bool = True
) -> Obj:
    probe = {"exec": {"command": ["vibey", "doctor", "--probe"]}, "timeoutSeconds": 20}
    return {
        "name": name,
        "image": IMAGE,
        "args": args,
        "env": _env(fleet),
        "envFrom": _env_from(fleet),
        "ports": [{"name": "metrics", "containerPort": fleet.metrics_port}],
        "volumeMounts": _mounts(worktrees=worktrees),
        "securityContext": _security(),
        "resources": _resources(resources),
        "readinessProbe": {**probe, "periodSeconds": 30, "failureThreshold": 2},
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 30,
            "timeoutSeconds": 5,
            "failureThreshold": 4,
        },
        "startupProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 5,
            "failureThreshold": 60,
        },
    }


def _resources(resources: Resources) -> Obj:
    limits = {
        key: value
        for key, value in (("cpu", resources.cpu_limit), ("memory", resources.memory_limit))
        if value is not None
    }
    out: Obj = {"requests": {"cpu": resources.cpu, "memory": resources.memory}}
    if limits:
        out["limits"] = limits
    return out


def _pdb(fleet: Fleet, name: str, component: str = "worker") -> Obj:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(fleet, name, component),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": {"vibey.dev/deployment": name, **_instance(fleet)}},
        },
    }


def _scaled_object(fleet: Fleet, name: str, triggers: list[Obj], *, low: int, high: int) -> Obj:
    metadata = _meta(fleet, name, "autoscaling")
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": metadata,
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": f"{fleet.name}-{name}",
            },
            "minReplicaCount": low,
            "maxReplicaCount": high,
            "pollingInterval": 15,
            "cooldownPeriod": 300,
            # A scaler that keeps failing (the management API or the database away) holds
            # the target here instead of scaling it to zero under running steps.
            "fallback": {"failureThreshold": FALLBACK_FAILURES, "replicas": max(low, 1)},
            "triggers": triggers,
        },
    }


def _pool_scaler(fleet: Fleet, pool: Pool) -> Obj:
    if fleet.backend == "rabbitmq":
        names = QueueNames(fleet.settings.bus.prefix)
        queues = [
            names.work_queue(lane, project)
            for lane in pool.lanes
            for project in (pool.projects or [None])
        ]
        triggers = [_rabbitmq_trigger(fleet, queue, pool.parallelism) for queue in queues]
    else:
        building = build_kinds(load_registry(fleet.settings).kinds)
        work = Work.for_lanes(pool.lanes, pool.projects or None, build_kinds=building)
        triggers = [_postgres_trigger(fleet, work, pool.parallelism)]
    return _scaled_object(
        fleet, f"worker-{pool.name}", triggers, low=pool.min_replicas, high=pool.max_replicas
    )


def _engine_scaler(fleet: Fleet, engine: Engine) -> Obj:
    queue = RunsTopology(fleet.settings.bus.prefix, (engine.id,)).queue(engine.id)
    trigger = _rabbitmq_trigger(fleet, queue, engine.prefetch)
    return _scaled_object(
        fleet, f"loop-{engine.id}", [trigger], low=engine.min_replicas, high=engine.max_replicas
    )


def _rabbitmq_trigger(fleet: Fleet, queue: str, value: int) -> Obj:
    return {
        "type": "rabbitmq",
        "name": queue.replace(".", "-"),
        "authenticationRef": {"name": f"{fleet.name}-keda"},
        "metadata": {
            "protocol": "http",
            "mode": "QueueLength",
            "queueName": queue,
            "vhostName": fleet.settings.bus.vhost,
            "value": str(value),
            "activationValue": "0",
            "excludeUnacknowledged": "false",
        },
    }


def _postgres_trigger(fleet: Fleet, work: Work, value: int) -> Obj:
    return {
        "type": "postgresql",
        "name": "claimable-and-leased",
        "authenticationRef": {"name": f"{fleet.name}-keda"},
        "metadata": {
            "query": scaler_query(work),
            "targetQueryValue": str(value),
            "activationTargetQueryValue": "0",
        },
    }


def _migrate_job(fleet: Fleet, release: str) -> Obj:
    """``vibey migrate`` for this release: a Job named per release, so a new image tag is a
    new Job (a Job's template is immutable; the old one is removed by its ttl). Safe to run
    again and concurrently (one advisory lock, one transaction per migration)."""
    name = f"migrate-{release_label(release)}"
    container = {
        "name": "migrate",
        "image": IMAGE,
        "args": ["migrate"],
        # Only the database URL: no settings mounted, so a changed vibey.toml (a new
        # ConfigMap hash) never changes this Job's immutable template.
        "env": [
            {
                "name": "VIBEY_PG_URL",
                "valueFrom": {"secretKeyRef": {"name": fleet.secret, "key": "pg-url"}},
            },
        ],
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": _security(),
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "256Mi"},
        },
    }
    labels = _labels(fleet, "migrations", "migrate")
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(
            fleet,
            name,
            "migrations",
            annotations={
                "argocd.argoproj.io/hook": "PreSync",
                "argocd.argoproj.io/hook-delete-policy": "BeforeHookCreation",
            },
        ),
        "spec": {
            "backoffLimit": 6,
            "ttlSecondsAfterFinished": 86400,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": fleet.name,
                    "automountServiceAccountToken": False,
                    "restartPolicy": "OnFailure",
                    "securityContext": _pod_security(),
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


# The console and notify run no step and serve no metrics port: no workspace, no metrics.
_NO_WORKTREES_ENV = {"VIBEY_METRICS_PORT", "VIBEY_ENGINE_WORKSPACE"}


def _console_deployment(fleet: Fleet, console: Console) -> Obj:
    """``vibey console`` on all addresses of its pod, its sign-in hashes from a Secret."""

    def hashed(env: str, key: str) -> Obj:
        ref = {"name": console.secret, "key": key, "optional": True}
        return {"name": env, "valueFrom": {"secretKeyRef": ref}}

    args = ["console"] + (["--read-only"] if console.read_only else [])
    container = _container(fleet, "console", args, console.resources, worktrees=False)
    container["env"] += [
        {"name": "VIBEY_CONSOLE_HOST", "value": "0.0.0.0"},
        {"name": "VIBEY_CONSOLE_PORT", "value": str(console.port)},
        {"name": "VIBEY_CONSOLE_ALLOW_REMOTE", "value": "1"},
        hashed("VIBEY_CONSOLE_PASSWORD_HASH", "password-hash"),
        hashed("VIBEY_CONSOLE_TOKEN_HASH", "token-hash"),
    ]
    container["env"] = [e for e in container["env"] if e["name"] not in _NO_WORKTREES_ENV]
    container["ports"] = [{"name": "http", "containerPort": console.port}]
    http = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 15}
    container["livenessProbe"] = {**http, "timeoutSeconds": 5, "failureThreshold": 4}
    container["startupProbe"] = {**http, "periodSeconds": 5, "failureThreshold": 60}
    deployment = _deployment(
        fleet,
        "console",
        "console",
        container,
        replicas=console.replicas,
        worktrees=False,
        metrics=False,
    )
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30
    return deployment


def _console_service(fleet: Fleet, console: Console) -> Obj:
    """ClusterIP: the operator's ingress (TLS, the public name) routes to port ``http``."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(fleet, "console", "console"),
        "spec": {
            "type": "ClusterIP",
            "selector": {"vibey.dev/deployment": "console", **_instance(fleet)},
            "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def _notify_deployment(fleet: Fleet) -> Obj:
    """``vibey notify``: one consumer of the events exchange; each webhook's secret comes
    from the Secret ``notify_secret`` (key ``VIBEY_NOTIFY_WEBHOOK_<NAME>_SECRET``)."""
    container = _container(fleet, "notify", ["notify"], Resources(cpu="100m", memory="256Mi"))
    container.pop("ports")
    container["env"] = [e for e in container["env"] if e["name"] not in _NO_WORKTREES_ENV]
    for probe in ("livenessProbe", "startupProbe"):
        container.pop(probe)
    deployment = _deployment(
        fleet, "notify", "notify", container, replicas=1, worktrees=False, metrics=False
    )
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 60
    return deployment
