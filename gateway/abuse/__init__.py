"""Abuse limits (docs/operations.md): the counting behind them, and per-user usage shared between
gateway processes."""
