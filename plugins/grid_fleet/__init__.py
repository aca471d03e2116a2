"""Logical fleet on one machine: ``grid test start|status|watch|stop|demo|replay``."""
