"""Built-in workflow prediction: affinity-key sequences and model co-activation."""
