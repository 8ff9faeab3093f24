"""Row-per-message conversations in SQL: the sans-I/O programs SQLite and PostgreSQL share."""
