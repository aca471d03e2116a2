"""Grid GPU plugin: this host's NVIDIA GPUs from NVML (``nvidia-ml-py``)."""
