"""Launchers: local processes (the embedded default) and Docker Swarm containers."""
