"""The one lease engine: fenced updates, the heartbeat, expired leases, the retry policy."""
