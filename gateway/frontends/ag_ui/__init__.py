"""AG-UI (and CopilotKit's runtime routes) on the gateway: `events` projects the thread log into
AG-UI events, `run_input` reads a `RunAgentInput`, `http` serves run, connect and stop, and
`copilotkit` describes the agents to CopilotKit (docs/protocol.md §12)."""
