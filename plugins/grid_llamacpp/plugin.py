"""Entry point of the grid_llamacpp plugin."""
