"""Who is calling (tokens, claims, keys), what they may do (docs/protocol.md §3), and the audit
trail of what they did."""
