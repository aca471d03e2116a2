"""llama.cpp runtime: Grid-owned llama-server children, engine install, tiny-model maker."""
