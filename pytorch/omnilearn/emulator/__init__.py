"""The heterogeneity emulator: levels, schedules, the CPU-request protocol, backends, the toggler."""
