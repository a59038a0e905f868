"""docs/compatibility.md's table of API keys says what the code does: a row for every key
Kafka 4.x defines (kio's index), its "Kafka 4.x" column kio's range, its "Ottla" column
what ApiVersions advertises at the default `transaction.version` (the conformance test
sends every one of those), and every version below kio's range that Ottla serves has a
class generated from Kafka 3.9's schemas."""

from __future__ import annotations

import re
from pathlib import Path

from kio.schema.index import api_key_map, schema_name_map
from kio.static.constants import EntityType

from ottla.config import BrokerConfig
from ottla.protocol.legacy import index as legacy
from ottla.server.features import supported_versions
from ottla.server.handlers import load_handlers

_ROW = re.compile(r"\|\s*(\d+)\s*\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|")
_DOC = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"


def _range(text: str) -> tuple[int, int] | None:
    if text == "-":
        return None
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def _rows() -> dict[int, tuple[str, str, str, str]]:
    return {int(m[1]): m.groups()[1:] for line in _DOC.read_text().splitlines() if (m := _ROW.match(line))}


def _kio_range(key: int) -> tuple[int, int]:
    versions = [v for v, types in schema_name_map[api_key_map[key]].items() if EntityType.request in types]
    return min(versions), max(versions)


def test_every_kafka_api_key_has_a_row_with_kio_s_range_and_what_ottla_advertises():
    rows = _rows()
    advertised = supported_versions(load_handlers(), BrokerConfig())
    assert set(api_key_map) <= set(rows)
    assert set(advertised) <= set(rows)
    for key, (name, _, kafka_4x, ottla) in rows.items():
        assert _range(ottla) == advertised.get(key), (key, name)
        assert _range(kafka_4x) == (_kio_range(key) if key in api_key_map else None), (key, name)


def test_every_served_version_has_a_schema_class():
    for key, (low, high) in supported_versions(load_handlers(), BrokerConfig()).items():
        kio_low = _kio_range(key)[0] if key in api_key_map else high + 1
        for version in range(low, min(kio_low, high + 1)):
            assert (key, version) in legacy.REQUESTS, (key, version)
