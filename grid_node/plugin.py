"""Entry point of the grid_node plugin (CLI commands)."""
