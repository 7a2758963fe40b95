"""The store: compressed dumps, the SQLite index and its one schema, retention, per-user views."""
