"""grid-echo-runtime: an example Grid runtime plugin (see docs/plugins.md in Grid)."""
