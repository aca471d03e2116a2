"""Scenario lab commands: grid test scenario / graduate."""
