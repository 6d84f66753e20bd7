"""Models of the example `payments` app."""
