"""What the gateway runs: the registry of agent graphs, their run settings and caller, the model
providers, and the exactly-once ledger tool authors use (docs/agents.md)."""
