"""Entry point of the grid_classifier plugin."""
