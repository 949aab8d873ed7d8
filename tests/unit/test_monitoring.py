"""The dashboard and the alert rules in ops/monitoring name only metrics vibey exports.

The exported names come from the runtime itself: the event metrics of actors.metrics and the
families StoreCollector yields (over a fake of the operations store), so a renamed metric
breaks this test rather than a dashboard in production.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import yaml

from actors import metrics
from store.operations import Heartbeat

MONITORING = Path(__file__).resolve().parents[2] / "ops" / "monitoring"
_NAME = re.compile(r"\bvibey_[a-z_]+")
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


class FakeOperations:
    def live_jobs(self):
        return [("ready", "design.spec", 2)]

    def outbox_lag(self):
        return 1, 12.5

    def open_gate_ages(self):
        return [("question", 1, 30.0)]

    def dead_letter_count(self):
        return 3

    def circuits(self):
        return [("claude", "open", "Available")]

    def latest_heartbeat(self):
        return Heartbeat("w", datetime.now(UTC), 4.0, 10, {})


def exported() -> set[str]:
    names = {
        m._name
        for m in (
            metrics.STEP_RESULTS,
            metrics.STEP_DURATION,
            metrics.DISPATCH_LATENCY,
            metrics.RECONCILE_DURATION,
            metrics.RECONCILE_FINDINGS,
            metrics.RECONCILE_FAILURES,
        )
    }
    collector = metrics.StoreCollector(FakeOperations(), dead_queue_depth=lambda: 0)  # type: ignore[arg-type]
    return names | {family.name for family in collector.collect()}


def base(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def test_the_store_collector_reports_the_state_it_read():
    collector = metrics.StoreCollector(FakeOperations())  # type: ignore[arg-type]
    families = {f.name: f for f in collector.collect()}
    assert families["vibey_store_up"].samples[0].value == 1
    assert families["vibey_outbox_oldest_unsent_seconds"].samples[0].value == 12.5
    (circuit,) = families["vibey_engine_circuit"].samples
    assert circuit.labels == {"engine": "claude", "state": "open"}
    assert "vibey_dead_letter_queue_depth" not in families  # no broker to ask


def test_a_store_that_does_not_answer_reports_down_not_an_error():
    class Down(FakeOperations):
        def live_jobs(self):
            raise OSError("connection refused")

    families = list(metrics.StoreCollector(Down()).collect())  # type: ignore[arg-type]
    assert [(f.name, f.samples[0].value) for f in families] == [("vibey_store_up", 0)]


def test_a_broker_that_does_not_answer_reports_down_and_keeps_the_store_gauges():
    def refused() -> int:
        raise ConnectionRefusedError("connection refused")

    collector = metrics.StoreCollector(FakeOperations(), dead_queue_depth=refused)  # type: ignore[arg-type]
    families = {f.name: f for f in collector.collect()}
    assert families["vibey_store_up"].samples[0].value == 1
    assert families["vibey_broker_up"].samples[0].value == 0
    assert families["vibey_outbox_unsent"].samples[0].value == 1
    assert "vibey_dead_letter_queue_depth" not in families


def test_a_store_that_does_not_answer_keeps_the_broker_gauges():
    class Down(FakeOperations):
        def outbox_lag(self):
            raise OSError("connection refused")

    collector = metrics.StoreCollector(Down(), dead_queue_depth=lambda: 4)  # type: ignore[arg-type]
    families = {f.name: f for f in collector.collect()}
    assert families["vibey_store_up"].samples[0].value == 0
    assert "vibey_jobs" not in families
    assert families["vibey_broker_up"].samples[0].value == 1
    assert families["vibey_dead_letter_queue_depth"].samples[0].value == 4


def test_the_down_alerts_each_watch_their_own_source():
    rules = yaml.safe_load((MONITORING / "alerts.yaml").read_text(encoding="utf-8"))
    alerts = {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"]}
    assert set(_NAME.findall(alerts["VibeyStoreDown"]["expr"])) == {"vibey_store_up"}
    assert set(_NAME.findall(alerts["VibeyBrokerDown"]["expr"])) == {"vibey_broker_up"}


def test_every_alert_names_exported_metrics_and_says_what_to_do():
    rules = yaml.safe_load((MONITORING / "alerts.yaml").read_text(encoding="utf-8"))
    known = exported()
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert {"VibeyDeadLettersGrowing", "VibeyOutboxLag", "VibeyNoReconcileHeartbeat"} <= {
        a["alert"] for a in alerts
    }
    for alert in alerts:
        used = {base(n) for n in _NAME.findall(alert["expr"])}
        assert used and used <= known, (alert["alert"], used - known)
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}
        assert alert["annotations"]["summary"]


def test_every_dashboard_panel_queries_exported_metrics():
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text(encoding="utf-8"))
    known = exported()
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 15
    for expr in exprs:
        used = {base(n) for n in _NAME.findall(expr)}
        assert used and used <= known, (expr, used - known)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
