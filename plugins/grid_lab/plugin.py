"""Entry point of the grid_lab plugin."""
