"""Forward-only SQL migrations, applied in order by `vibey migrate`."""
