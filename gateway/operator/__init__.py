"""The operator's command line: `python -m gateway runs|approvals|threads ...` (docs/operations.md
"Operator's command line").

It works on the gateway's database directly, with no gateway running and no token: whoever can
read the database can use it, and nobody else. Reads go through the same repositories as the
gateway; `runs cancel` goes through the same cancellation (gateway/run_lifecycle/cancellation.py).

- `filters.py`: the command line's filters (states, durations) as typed values
- `output.py`: tables for people and JSON for scripts, from the records
- `cancel.py`: cancelling a run from outside any gateway process
- `commands.py`: the sub-commands, the database they open and their exit statuses
"""
