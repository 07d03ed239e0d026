"""The PostgreSQL backend of the Store seam (persistence/store.py), through asyncpg."""
