"""Prefect flows: the release recipe and the scheduled publication."""
