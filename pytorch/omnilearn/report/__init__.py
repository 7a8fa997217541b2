"""Run summaries, tables and figures."""
