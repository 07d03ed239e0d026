"""The offline demo agent `assistant` (docs/protocol.md §9)."""
