"""The parts of OpenLineage's JSON schema (spec/OpenLineage.json 2-0-2 and the facet schemas
spec/facets/*.json) that arrayjob's events use, as JSON Schema for ``jsonschema``.

Written out here because neither openlineage-python nor any package a registry serves ships
the schema files, and the tests cannot reach openlineage.io; each definition keeps the
``required`` keys, types and enums of the official one it is named after.
"""

from __future__ import annotations

from typing import Any

_URI = {"type": "string", "format": "uri"}

BASE_FACET: dict[str, Any] = {
    "type": "object",
    "properties": {"_producer": _URI, "_schemaURL": _URI},
    "required": ["_producer", "_schemaURL"],
}

PARENT_RUN_FACET: dict[str, Any] = {
    "allOf": [{"$ref": "#/$defs/BaseFacet"}, {
        "type": "object",
        "properties": {
            "run": {"type": "object", "properties": {"runId": {"type": "string", "format": "uuid"}},
                    "required": ["runId"]},
            "job": {"type": "object", "properties": {"namespace": {"type": "string"}, "name": {"type": "string"}},
                    "required": ["namespace", "name"]},
            "root": {"type": "object", "properties": {
                "run": {"type": "object", "properties": {"runId": {"type": "string", "format": "uuid"}},
                        "required": ["runId"]},
                "job": {"type": "object", "properties": {"namespace": {"type": "string"}, "name": {"type": "string"}},
                        "required": ["namespace", "name"]}},
                "required": ["run", "job"]},
        },
        "required": ["run", "job"],
    }],
}

SCHEMA_DATASET_FACET: dict[str, Any] = {
    "allOf": [{"$ref": "#/$defs/BaseFacet"}, {
        "type": "object",
        "properties": {"fields": {"type": "array", "items": {"$ref": "#/$defs/SchemaDatasetFacetFields"}}},
    }],
}

ERROR_MESSAGE_RUN_FACET: dict[str, Any] = {
    "allOf": [{"$ref": "#/$defs/BaseFacet"}, {
        "type": "object",
        "properties": {"message": {"type": "string"}, "programmingLanguage": {"type": "string"},
                       "stackTrace": {"type": "string"}},
        "required": ["message", "programmingLanguage"],
    }],
}

RUN_EVENT: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$defs": {
        "BaseFacet": BASE_FACET,
        "SchemaDatasetFacetFields": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "type": {"type": "string"},
                           "description": {"type": "string"},
                           "fields": {"type": "array", "items": {"$ref": "#/$defs/SchemaDatasetFacetFields"}}},
            "required": ["name"],
        },
        "Dataset": {
            "type": "object",
            "properties": {
                "namespace": {"type": "string"}, "name": {"type": "string"},
                "facets": {"type": "object", "additionalProperties": {"$ref": "#/$defs/BaseFacet"},
                           "properties": {"schema": SCHEMA_DATASET_FACET}},
                "inputFacets": {"type": "object", "additionalProperties": {"$ref": "#/$defs/BaseFacet"}},
                "outputFacets": {"type": "object", "additionalProperties": {"$ref": "#/$defs/BaseFacet"}},
            },
            "required": ["namespace", "name"],
        },
    },
    "type": "object",
    "properties": {
        "eventType": {"type": "string", "enum": ["START", "RUNNING", "COMPLETE", "ABORT", "FAIL", "OTHER"]},
        "eventTime": {"type": "string", "format": "date-time"},
        "run": {"type": "object", "properties": {
            "runId": {"type": "string", "format": "uuid"},
            "facets": {"type": "object", "additionalProperties": {"$ref": "#/$defs/BaseFacet"},
                       "properties": {"parent": PARENT_RUN_FACET, "errorMessage": ERROR_MESSAGE_RUN_FACET}},
        }, "required": ["runId"]},
        "job": {"type": "object", "properties": {
            "namespace": {"type": "string"}, "name": {"type": "string"},
            "facets": {"type": "object", "additionalProperties": {"$ref": "#/$defs/BaseFacet"}},
        }, "required": ["namespace", "name"]},
        "inputs": {"type": "array", "items": {"$ref": "#/$defs/Dataset"}},
        "outputs": {"type": "array", "items": {"$ref": "#/$defs/Dataset"}},
        "producer": _URI,
        "schemaURL": _URI,
    },
    "required": ["eventTime", "run", "job", "producer", "schemaURL"],
}


def validate(event: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``event`` is a valid OpenLineage run event
    (formats checked: uri, uuid, date-time)."""
    import jsonschema

    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    jsonschema.Draft202012Validator(RUN_EVENT, format_checker=checker).validate(event)
