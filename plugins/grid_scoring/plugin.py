"""Entry point of the grid_scoring plugin."""
