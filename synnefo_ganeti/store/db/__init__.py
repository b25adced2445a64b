"""The engine and the writer: engines and URLs, SQLite's WAL and PostgreSQL's locks, the one
batching writer, set-based batches, the schema's base and its migrations."""
