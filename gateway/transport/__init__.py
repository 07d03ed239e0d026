"""How clients reach the gateway: the WebSocket endpoint and its connections, the HTTP API,
Server-Sent Events and the demo's static files. Imports nothing of persistence."""
