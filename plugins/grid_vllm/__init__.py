"""Grid runtime plugin for vLLM: managed ``vllm serve`` children (see ``adapter``)."""
