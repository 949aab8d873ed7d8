"""Dramatiq actors, the broker topology and the worker runtime."""
