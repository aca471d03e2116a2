"""Grid server: registry, allocator API, OpenAI-compatible router, controller runner."""
