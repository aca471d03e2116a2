"""Built-in bounded request classifier (keywords and request shape)."""
