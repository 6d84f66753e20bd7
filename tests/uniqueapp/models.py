"""Unique-job kinds used by the tests."""
