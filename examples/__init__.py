"""Workflows that are not the vibey protocol, each with its own step kinds and gates.

* :mod:`examples.orders`: reserve stock, a typed human approval with a deadline, charge — or,
  when rejected (or the deadline passes), a compensating step that releases the stock;
* :mod:`examples.fanout`: N steps in parallel, then one that merges their results.

Run them on the real stack::

    export VIBEY_WORKFLOW_DEFINITIONS=examples:DEFINITIONS
    vibey worker --handlers examples:HANDLERS &
    vibey workflow start shop-1 --definition orders --input '{"order": "A-1", "amount": 120}'
    vibey gate list --project shop-1
    vibey gate answer <gate id> approve

or from Python with :class:`vibey.Client` (docs/writing-workflows.md).
"""

from __future__ import annotations

from examples import fanout, orders

DEFINITIONS = (orders.ORDERS, orders.QUICK_ORDERS, fanout.FANOUT)
HANDLERS = {**orders.HANDLERS, **fanout.HANDLERS}

__all__ = ["DEFINITIONS", "HANDLERS"]
