"""Prefect tasks: one release step each, thin wrappers over `dprelease.pipeline`."""
