"""DBOS Transact beside ``three_steps.py``: the same three no-op steps as one DBOS workflow.

Run by ``three_steps.py --dbos-python PY`` with a Python that has ``dbos`` installed (a
bench-only dependency: ``python -m venv /tmp/dbos && /tmp/dbos/bin/pip install dbos``), on a
scratch PostgreSQL database of its own. Prints one JSON line: the latency of one workflow at a
time (called directly, start → result), and ``--workflows`` workflows enqueued one by one on a
DBOS queue (``--concurrency`` per worker, polled every ``--poll`` seconds), completed/s.

    PY ops/bench/dbos_three_steps.py URL [--workflows 2000] [--samples 50]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time

from dbos import DBOS, DBOSConfig


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--workflows", type=int, default=2000)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--poll", type=float, default=0.01)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    config: DBOSConfig = {
        "name": "vibeybench",
        "system_database_url": args.url,
        "notification_listener_polling_interval_sec": args.poll,
    }
    DBOS(config=config)

    @DBOS.step()
    def one() -> None:
        pass

    @DBOS.step()
    def two() -> None:
        pass

    @DBOS.step()
    def three() -> None:
        pass

    @DBOS.workflow()
    def three_steps() -> int:
        one()
        two()
        three()
        return 3

    DBOS.launch()
    queue = DBOS.register_queue(
        "bench", worker_concurrency=args.concurrency, polling_interval_sec=args.poll
    )
    try:
        latencies = []
        for _ in range(args.samples):
            began = time.perf_counter()
            three_steps()
            latencies.append(time.perf_counter() - began)
        began = time.perf_counter()
        handles = [queue.enqueue(three_steps) for _ in range(args.workflows)]
        for handle in handles:
            handle.get_result()
        window = time.perf_counter() - began
    finally:
        DBOS.destroy()
    ordered = sorted(latencies)
    print(
        json.dumps(
            {
                "p50": statistics.median(latencies),
                "p90": ordered[round(0.9 * (len(ordered) - 1))],
                "throughput": args.workflows / window,
                "workflows": args.workflows,
                "concurrency": args.concurrency,
                "poll": args.poll,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
