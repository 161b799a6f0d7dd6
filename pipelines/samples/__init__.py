"""Sample releases for the demo and the tests."""
