"""A fleet's Kubernetes objects, rendered from ``fleet.toml`` and the overlay's ``vibey.toml``.

:func:`render` returns the objects the overlay's ``generated/fleet.yaml`` holds: per worker
pool a Deployment, a PodDisruptionBudget and (with ``keda``) a ScaledObject; per engine the
settings run with ``invocation = "service"`` a ``vibey loop-service`` Deployment, its
PodDisruptionBudget and (with ``keda``, on rabbitmq) a ScaledObject on ``<prefix>.runs.<id>``
(``value`` the engine's prefetch, unacknowledged runs counted); the TriggerAuthentication;
the worktrees PersistentVolumeClaim. The static parts (ServiceAccount, the migrations Job,
the reconciler) live in ``ops/kubernetes/base``. Every pod runs the image named ``vibey``
(the overlay's ``images:`` sets it), reads its settings from the ``vibey-settings``
ConfigMap and its URLs from the fleet's Secret, and never as root.

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
from vibey.kube_config import Engine, Fleet, Pool, Resources
from vibey.wiring import load_registry

Obj = dict[str, Any]
IMAGE = "vibey"
SETTINGS_CONFIGMAP = "vibey-settings"
SETTINGS_PATH = "/etc/vibey"
WORKTREES_PATH = "/work"
UID = 10001
KEDA_RABBITMQ_HOST_KEY = "keda-rabbitmq-host"
KEDA_PG_CONNECTION_KEY = "keda-pg-connection"


def render(fleet: Fleet) -> list[Obj]:
    objects: list[Obj] = [_worktrees(fleet)]
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
    return objects


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
    replicas = max(pool.min_replicas, 1) if not fleet.keda else pool.min_replicas
    container = _container(fleet, "worker", _worker_args(fleet, pool), pool.resources)
    return _deployment(fleet, name, "worker", container, replicas=replicas)


def _scales_engines(fleet: Fleet) -> bool:
    """KEDA scales a loop service on its run queue: the TriggerAuthentication holds the
    RabbitMQ management host only on the rabbitmq backend (elsewhere: fixed replicas)."""
    return fleet.keda and fleet.backend == "rabbitmq"


def _engine_deployment(fleet: Fleet, engine: Engine) -> Obj:
    """``vibey loop-service``: on SIGTERM its runs get the longest of the leases and the
    engine's run time to finish (``--drain-grace``), and the pod that long plus the margin."""
    drain = max(fleet.drain_grace_seconds, engine.run_seconds)
    args = ["loop-service", f"--engine={engine.id}", f"--drain-grace={drain}"]
    container = _container(fleet, "loop-service", args, engine.resources)
    replicas = engine.min_replicas if _scales_engines(fleet) else max(engine.min_replicas, 1)
    deployment = _deployment(
        fleet, f"loop-{engine.id}", "loop-service", container, replicas=replicas
    )
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = (
        drain + fleet.grace_margin_seconds
    )
    return deployment


def _deployment(fleet: Fleet, name: str, component: str, container: Obj, *, replicas: int) -> Obj:
    labels = _labels(fleet, component, name)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(fleet, name, component),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"vibey.dev/deployment": name, **_instance(fleet)}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0}},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(fleet.metrics_port),
                    },
                },
                "spec": _pod_spec(fleet, container),
            },
        },
    }


def _instance(fleet: Fleet) -> dict[str, str]:
    return {"app.kubernetes.io/instance": fleet.name}


def _pod_spec(fleet: Fleet, container: Obj) -> Obj:
    return {
        "serviceAccountName": fleet.name,
        "automountServiceAccountToken": False,
        # SIGTERM drains: running steps settle first, and a step may hold its lease this long.
        "terminationGracePeriodSeconds": fleet.drain_grace_seconds + fleet.grace_margin_seconds,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UID,
            "runAsGroup": UID,
            "fsGroup": UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [_wait_for_schema(fleet)],
        "containers": [container],
        "volumes": [
            {"name": "settings", "configMap": {"name": SETTINGS_CONFIGMAP}},
            {
                "name": "worktrees",
                "persistentVolumeClaim": {"claimName": f"{fleet.name}-worktrees"},
            },
            {"name": "tmp", "emptyDir": {}},
        ],
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
    if fleet.backend == "rabbitmq" or fleet.engines:  # loop services ride on RabbitMQ
        env.append(secret("VIBEY_AMQP_URL", "amqp-url"))
    return env


def _mounts() -> list[Obj]:
    return [
        {"name": "settings", "mountPath": SETTINGS_PATH, "readOnly": True},
        {"name": "worktrees", "mountPath": WORKTREES_PATH},
        {"name": "tmp", "mountPath": "/tmp"},
    ]


def _security() -> Obj:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _wait_for_schema(fleet: Fleet) -> Obj:
    """Hold the pod until the migrations Job has run (``vibey doctor --probe`` is false while
    a migration is pending or a service does not answer)."""
    return {
        "name": "wait-for-schema",
        "image": IMAGE,
        "command": ["sh", "-c", "until vibey doctor --probe; do sleep 5; done"],
        "env": _env(fleet),
        "volumeMounts": _mounts(),
        "securityContext": _security(),
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
    }


def _container(fleet: Fleet, name: str, args: list[str], resources: Resources) -> Obj:
    probe = {"exec": {"command": ["vibey", "doctor", "--probe"]}, "timeoutSeconds": 20}
    return {
        "name": name,
        "image": IMAGE,
        "args": args,
        "env": _env(fleet),
        "ports": [{"name": "metrics", "containerPort": fleet.metrics_port}],
        "volumeMounts": _mounts(),
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
