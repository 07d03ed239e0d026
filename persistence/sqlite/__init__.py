"""The SQLite backend of the Store seam (persistence/store.py)."""
