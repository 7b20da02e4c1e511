"""Evaluators: the vetted catalogue of evaluation functions for utility signaling (relative error,
distances, rank agreement, top-k overlap, threshold share, a classifier's accuracy), each with what
its value on raw data can reveal, and the plug-in point (entry point group `dprelease.evaluators`)
through which a controller may enable more, by name, in a policy.
"""

from .registry import BUILTIN, GROUP, Evaluator, catalogue, enabled_evaluator

__all__ = ["BUILTIN", "GROUP", "Evaluator", "catalogue", "enabled_evaluator"]
