"""Grid runtime plugin for Ollama: model memory of a loopback Ollama service (see ``adapter``)."""
