"""The base layer: what every other part builds on (routing, on-commit actions, JSON,
durations, backoff, tracing, SQL dialects, transient errors, option tables)."""
