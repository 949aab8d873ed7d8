"""The vibey CLI, settings and wiring."""

# The one place the version is written: pyproject.toml reads it ([tool.hatch.version]), and
# `vibey --version` prints it without importlib.metadata (tens of milliseconds at start-up).
__version__ = "0.1.0"
