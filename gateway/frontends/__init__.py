"""The protocols frontends already speak, served as projections of the thread log.

Each vocabulary (the Vercel AI SDK's UI message stream in `ai_sdk/`, AG-UI in `ag_ui/`) is one
pure translation from stored events to its chunks or events, plus thin transports. The log stays
the single source of truth: every chunk is derived from an event that was stored before it is
sent, so a replay from the log gives the same chunks again; decisions go through the run
lifecycle's own checks against the server's pending approvals; a dropped connection never stops a
run.
"""
