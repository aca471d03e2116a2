"""Grid node agent: telemetry, host protection, heartbeats, actuator."""
