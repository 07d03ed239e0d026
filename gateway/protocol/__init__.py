"""The wire protocol (docs/protocol.md §2-§7): the frames clients send and the gateway sends,
the errors it answers with, who a connection speaks for, and the connection's state machine
(sans I/O: frames and events in, actions out). Imports nothing else of the gateway."""
