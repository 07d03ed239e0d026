"""The gateway server: one package per concept (protocol, transport, server, auth, run_lifecycle,
event_log, agents, abuse, observability, storage, operator, specs), composed by app.py."""
