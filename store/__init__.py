"""PostgreSQL: the record store (pool, named SQL, repositories, migrations runner).

A store call's name says which transaction it runs in:

* ``x(...)`` opens its own (and retries it where that is safe: :mod:`store.retry`);
* ``x_txn(unit, ...)`` joins the caller's :class:`~store.unit_of_work.UnitOfWork`: its
  transaction and the outbox rows written in it, which are handed to the relay after the
  commit. Every write that may release a job, and everything composed with one, takes a unit;
* ``x_on(conn, ...)`` runs on the caller's connection, in whatever transaction it has open:
  statements that write no outbox row and are also used where no unit of work exists (the
  reaper's gates, engine health, a domain event or ledger append, a delivery row).

A ``*_txn`` callable never takes a bare connection and a ``*_on`` one always does
(``tests/unit/test_txn_convention.py`` holds both). Private statement helpers take ``conn``
first and need no suffix: they have no own-transaction form to be told from.
"""
