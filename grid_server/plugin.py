"""Entry point of the grid_server plugin (CLI commands)."""
