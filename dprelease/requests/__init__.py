"""Release requests: what an analyst asks for (SQL in either DP syntax, or a spec of group keys and
aggregates) and how epsilon is to be chosen (a value, the privacy risk indicator, or the risk
model), parsed from YAML/JSON and checked before any data is read. It owns the request's format and
its validation, and the translation of a spec into the engine's typed query; `inbox` keeps the
analysts' submitted requests until a controller runs them.
"""

from .request import ReleaseRequest, RequestError, load_request, parse_request, query_from_spec

__all__ = ["ReleaseRequest", "RequestError", "load_request", "parse_request", "query_from_spec"]
