"""Schema lookup: kio's classes first, then the ones generated for what kio 0.6 lacks.

kio is generated from Kafka 4's schemas; `ottla.protocol.legacy` holds the classes
generated from Kafka 3.9's (ZooKeeper-era controller APIs, versions KIP-896 removed), in
kio's style so kio's readers and writers serialize both alike. A few of kio's classes are
replaced by subclasses carrying Ottla's own tagged fields (`protocol/extensions.py`).
"""

from __future__ import annotations

from functools import cache
from pkgutil import resolve_name

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.schema.index import api_key_map

from .extensions import extended_request, extended_response
from .legacy import index as legacy_index


@cache
def request_schema(api_key: int, api_version: int) -> type:
    """The request class; raises kio's UnknownAPIKey/UnknownEntity when neither has it."""
    extended = extended_request(api_key, api_version)
    if extended is not None:
        return extended
    try:
        return load_request_schema(api_key, api_version)
    except (UnknownAPIKey, UnknownEntity):
        path = legacy_index.REQUESTS.get((api_key, api_version))
        if path is None:
            raise
        return resolve_name(path)


@cache
def response_schema(api_key: int, api_version: int) -> type:
    extended = extended_response(api_key, api_version)
    if extended is not None:
        return extended
    try:
        return load_response_schema(api_key, api_version)
    except (UnknownAPIKey, UnknownEntity):
        path = legacy_index.RESPONSES.get((api_key, api_version))
        if path is None:
            raise
        return resolve_name(path)


@cache
def api_name(api_key: int) -> str:
    """Kafka's name for an API ("Metadata" for 3), for log lines and errors: kio's, or for the
    APIs only the generated classes have, theirs."""
    name = api_key_map.get(api_key)
    if name is not None:
        return "".join(part.title() for part in name.split("_"))
    for (key, _), path in legacy_index.REQUESTS.items():
        if key == api_key:
            return path.rpartition(":")[2].removesuffix("Request")
    return f"API {api_key}"
