"""Every thread's event log: its single writer, the entries it commits, the bus and relay that
wake readers in this process and others, subscriptions, and the webhooks that announce events."""
