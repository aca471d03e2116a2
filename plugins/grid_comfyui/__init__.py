"""Grid runtime plugin for ComfyUI: workflow manifests on a loopback ComfyUI (``adapter``)."""
