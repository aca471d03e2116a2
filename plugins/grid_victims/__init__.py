"""Built-in preemption victim selection."""
