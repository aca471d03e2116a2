"""Entry point of the grid_bench plugin."""
