"""PostgreSQL: the record store (pool, named SQL, repositories, migrations runner)."""
