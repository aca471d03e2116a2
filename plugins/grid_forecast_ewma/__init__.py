"""Built-in demand forecaster: bucketed EWMA plus a positive-only trend."""
