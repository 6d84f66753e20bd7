"""Models of the example `blogs` app."""
