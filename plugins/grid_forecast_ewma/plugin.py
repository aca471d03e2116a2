"""Entry point of the built-in EWMA forecaster (filled in by the planner work)."""
