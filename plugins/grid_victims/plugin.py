"""Entry point of the grid_victims plugin."""
