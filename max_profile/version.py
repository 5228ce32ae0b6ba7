"""The version of max_profile (one place: the package root re-exports it; reports carry it)."""

__version__ = "0.1.0"
