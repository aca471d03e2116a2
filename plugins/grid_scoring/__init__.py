"""Built-in placement score terms."""
