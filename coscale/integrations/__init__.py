"""Bridges from other libraries' settings to coscale's (each imports its library at first use)."""
