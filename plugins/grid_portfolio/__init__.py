"""Built-in portfolio search for unbound workload demand (``grid_search_portfolio``)."""
