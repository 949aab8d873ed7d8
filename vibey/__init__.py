"""The vibey CLI, settings and wiring."""
