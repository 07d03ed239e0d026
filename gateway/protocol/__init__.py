"""The wire protocol (docs/protocol.md §2-§7): the frames clients send and the gateway sends,
and the errors it answers with. Imports nothing else of the gateway."""
