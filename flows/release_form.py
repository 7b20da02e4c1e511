"""The dp-release deployment's run form in the Prefect UI: what its fields offer.

Prefect draws the form from the deployment's parameter schema (JSON schema), fixed when the
deployment is made. Two things a person needs there are not in the flow's signature:

- the registered datasets, offered as a list: `refresh` writes them into the schema as an enum
  (Prefect 3.8 draws an enum as a select), after `prefect deploy` and after each registration,
  with each dataset's registered risk profile beside the risk-model fields that default to it
  (`registered`: a form cannot change its defaults with the dataset chosen, so the value is read
  from the chosen dataset when the release is planned);
- optional text fields without Prefect's "None" variant: a `str | None` parameter is drawn as two
  toggles (str, None) and, on None, the line `Property is type "None"`. `Text` and `Mapping` are
  plain string and object fields whose empty value means "not given" (None is accepted as well,
  from the Python API and the CLI).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator

#: a text parameter that may be left empty ("" = not given); None from Python callers reads as ""
Text = Annotated[str, BeforeValidator(lambda v: "" if v is None else v)]
#: a mapping parameter that may be left empty ({} = not given); None reads as {}
Mapping = Annotated[dict, BeforeValidator(lambda v: {} if v is None else v)]

#: the deployments whose form is the release flow's (prefect.yaml)
RELEASE_DEPLOYMENTS = ("dp-release",)


#: the risk-model fields whose form default (`registered`) is the dataset's registered risk profile
PROFILE_FIELDS = ("trust", "sensitivity", "max_risk")


def dataset_schema(schema: dict, profiles: dict[str, dict]) -> dict:
    """The parameter schema with `dataset` offered as a list of the registered (protected)
    datasets, and each risk-model field that defaults to `registered` saying what that is for each
    of them; the dataset stays free text when none is registered."""
    updated = {**schema, "properties": {**schema.get("properties", {})}}
    field = dict(updated["properties"].get("dataset", {"type": "string", "title": "dataset"}))
    field.pop("enum", None)
    if profiles:
        field["enum"] = sorted(profiles)
    updated["properties"]["dataset"] = field
    risk_model = schema.get("definitions", {}).get("RiskEpsilon")
    if risk_model:
        properties = {**risk_model["properties"]}
        for name in PROFILE_FIELDS:
            base = properties[name]["description"].split(" (registered:")[0]
            values = "; ".join(f"{ds}: {p[name]}" for ds, p in sorted(profiles.items()) if name in p)
            suffix = f"the dataset's risk profile{', ' + values if values else ''}"
            properties[name] = {**properties[name], "description": f"{base} (registered: {suffix})"}
        updated["definitions"] = {**schema["definitions"], "RiskEpsilon": {**risk_model, "properties": properties}}
    return updated


def registered_profiles(settings) -> dict[str, dict]:
    """The datasets a release may query (registered, not public: a public table is never
    released alone), each with its registered risk profile."""
    import json

    from dprelease.store import Store

    return {d.name: json.loads(d.risk_json or "{}") for d in Store(settings.store_url).list_datasets() if d.privacy_unit}


def refresh(settings) -> list[str]:
    """Offer the registered datasets in the run form of every release deployment on the Prefect
    server of PREFECT_API_URL; returns the names of the deployments updated (none when the server
    has no such deployment yet)."""
    from prefect import get_client
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    profiles = registered_profiles(settings)
    updated = []
    with get_client(sync_client=True) as client:
        flt = DeploymentFilter(name=DeploymentFilterName(any_=list(RELEASE_DEPLOYMENTS)))
        for deployment in client.read_deployments(deployment_filter=flt):
            schema = dataset_schema(deployment.parameter_openapi_schema or {}, profiles)
            client.update_deployment(deployment.id, DeploymentUpdate(parameter_openapi_schema=schema))
            updated.append(deployment.name)
    return updated
