"""The run lifecycle (docs/protocol.md §1): starting, streaming, pausing for approvals, deciding,
continuing, cancelling and recovering runs, and what readers see of them. Knows no web framework."""
