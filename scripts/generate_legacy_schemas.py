#!/usr/bin/env python3
"""Generate kio-style schema classes for protocol versions kio 0.6 does not ship.

kio is generated from Kafka 4's message schemas, so the ZooKeeper-era controller APIs
(LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown) and every version
KIP-896 removed are missing from it. This script reads Kafka 3.9's JSON message schemas
(`clients/src/main/resources/common/message/*.json`) and writes, for every version a
schema defines and kio lacks, a module in kio's own style (frozen slotted dataclasses
with `__type__`, `__version__`, `__flexible__`, `__api_key__`, `__header_schema__` and
`kafka_type`/`tag` field metadata), so kio's `entity_reader`/`entity_writer` serialize
them. It also writes `index.py`, the (api key, version) -> class map `codec.py` falls
back to.

    python scripts/generate_legacy_schemas.py /tmp/kafka-3.9-schemas

The JSON inputs are not committed; the generated modules are, each naming its source.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from kio.index import UnknownAPIKey, UnknownEntity, load_entity_schema, load_request_schema, load_response_schema
from kio.static.constants import EntityType

OUT = Path(__file__).resolve().parent.parent / "src" / "ottla" / "protocol" / "legacy"
SOURCE = "clients/src/main/resources/common/message/{name}.json"
KAFKA_VERSION = "3.9"
MAX_LINE = 88

# kio's own naming rules (its codegen turns these into richer types).
ERROR_CODE_NAMES = frozenset({"ErrorCode", "PartitionErrorCode"})
TIMEDELTA_NAMES = frozenset({
    "timeoutMs", "TimeoutMs", "ThrottleTimeMs", "MaxWaitMs", "SessionLifetimeMs",
    "TransactionTimeoutMs", "MaxLifetimeMs", "SessionTimeoutMs", "RebalanceTimeoutMs",
    "ExpiryTimePeriodMs", "RenewPeriodMs", "RetentionTimeMs", "HeartbeatIntervalMs",
})
DATETIME_NAMES = frozenset({
    "IssueTimestampMs", "ExpiryTimestampMs", "MaxTimestampMs", "TransactionStartTimeMs",
    "LogAppendTimeMs",
})
ENTITY_TYPES = {
    "brokerId": "BrokerId", "topicName": "TopicName", "groupId": "GroupId",
    "producerId": "ProducerId", "transactionalId": "TransactionalId",
}
PRIMITIVE_HINTS = {
    "bool": "bool", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint16": "u16", "uint32": "u32", "uint64": "u64", "float64": "f64", "string": "str",
    "bytes": "bytes", "uuid": "uuid.UUID | None", "records": "Records",
    "error_code": "ErrorCode", "timedelta_i32": "i32Timedelta",
    "timedelta_i64": "i64Timedelta", "datetime_i64": "TZAware",
}
NUMERIC = frozenset({"int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float64"})
PRIMITIVE_IMPORTS = {
    "i8", "i16", "i32", "i64", "u16", "u32", "u64", "f64", "Records", "i32Timedelta",
    "i64Timedelta", "TZAware",
}


class Versions:
    """A Kafka version range: "0+", "1-3", "2" or "none"."""

    def __init__(self, text: str | None):
        text = (text or "none").strip()
        if text == "none":
            self.low, self.high = 0, -1
        elif text.endswith("+"):
            self.low, self.high = int(text[:-1]), 1 << 15
        elif "-" in text:
            low, high = text.split("-")
            self.low, self.high = int(low), int(high)
        else:
            self.low = self.high = int(text)

    def __contains__(self, version: int) -> bool:
        return self.low <= version <= self.high

    def __iter__(self):
        return iter(range(self.low, self.high + 1))


def load_json(path: Path) -> dict:
    """Kafka's schema files are JSON with // line comments."""
    lines = [line for line in path.read_text().splitlines() if not re.match(r"\s*//", line)]
    return json.loads("\n".join(lines))


def snake(name: str) -> str:
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()
    return {"id": "id_", "type": "type_", "hash": "hash_", "filter": "filter_"}.get(name, name)


def api_module_name(schema: dict) -> str:
    """kio's package name: `OffsetCommitRequest` -> `offset_commit`, `RequestHeader` -> `request_header`."""
    name = schema["name"]
    if schema["type"] in ("request", "response"):
        name = name.removesuffix("Request").removesuffix("Response")
    return snake(name)


@dataclass
class Context:
    """One module being generated: one schema at one version."""

    schema: dict
    version: int
    flexible: bool
    header_class: str
    common: dict
    classes: list[str]
    seen: set
    imports: set

    def kind(self) -> str:
        return self.schema["type"]


def field_kafka_type(field: dict) -> str:
    name, type_ = field["name"], field["type"]
    if name in ERROR_CODE_NAMES and type_ == "int16":
        return "error_code"
    if name in TIMEDELTA_NAMES:
        return {"int32": "timedelta_i32", "int64": "timedelta_i64"}[type_]
    if name in DATETIME_NAMES and type_ == "int64":
        return "datetime_i64"
    return type_


def python_field_name(field: dict) -> str:
    name = field["name"]
    if name in TIMEDELTA_NAMES or name in DATETIME_NAMES:
        name = name.removesuffix("Ms")
    return snake(name)


def format_default(kafka_type: str, default, hint: str, ctx: Context) -> str:
    text = str(default)
    if text == "null":
        return "None"
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        ctx.imports.add("import datetime")
        return f"{hint}.parse(datetime.timedelta(milliseconds={int(text, 0)}))"
    if kafka_type == "bool":
        return {"true": "True", "false": "False"}[text.lower()]
    if kafka_type == "string":
        return repr(text) if hint == "str" else f"{hint}({text!r})"
    if kafka_type in NUMERIC:
        if kafka_type == "float64":
            return f"{hint}({float(text)})"
        return f"{hint}({int(text, 0)})"
    if kafka_type == "error_code":
        return f"ErrorCode({int(text, 0)})"
    raise NotImplementedError(f"default {default!r} for {kafka_type}")


def implicit_default(kafka_type: str, hint: str, ctx: Context) -> str:
    """What a tagged field without a default in the schema defaults to (kio's rule)."""
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return format_default(kafka_type, "0", hint, ctx)
    return {"bool": "False", "string": '""' if hint == "str" else f'{hint}("")', "bytes": 'b""',
            "uuid": "None"}.get(kafka_type) or format_default(kafka_type, "0", hint, ctx)


def is_nullable(field: dict, kafka_type: str, version: int, tagged: bool) -> bool:
    if kafka_type in NUMERIC:
        return False
    if tagged and field.get("ignorable") and "default" not in field and kafka_type in ("string", "bytes"):
        return True
    if version in Versions(field.get("nullableVersions")):
        return True
    return kafka_type == "datetime_i64" and str(field.get("default")) == "-1"


def render_field(name: str, hint: str, kwargs: list[tuple[str, str]], about: str | None) -> list[str]:
    if kwargs:
        inner = ", ".join(f"{key}={value}" for key, value in kwargs)
        line = f"    {name}: {hint} = field({inner})"
        if len(line) > MAX_LINE:
            if len(f"        {inner}") <= MAX_LINE:
                lines = [f"    {name}: {hint} = field(", f"        {inner}", "    )"]
            else:
                lines = [f"    {name}: {hint} = field("]
                lines += [f"        {key}={value}," for key, value in kwargs]
                lines.append("    )")
        else:
            lines = [line]
    else:
        lines = [f"    {name}: {hint}"]
    if about:
        lines.append(f'    """{about}"""')
    return lines


def struct_fields(field: dict, ctx: Context) -> tuple[str, list[dict]]:
    struct = field["type"].removeprefix("[]")
    if "fields" in field:
        return struct, field["fields"]
    return struct, ctx.common[struct]["fields"]


def generate_class(name: str, fields: list[dict], ctx: Context, entity_type: str) -> None:
    if name in ctx.seen:
        return
    ctx.seen.add(name)
    lines = [
        "@dataclass(frozen=True, slots=True, kw_only=True)",
        f"class {name}:",
        f"    __type__: ClassVar = EntityType.{entity_type}",
        f"    __version__: ClassVar[i16] = i16({ctx.version})",
        f"    __flexible__: ClassVar[bool] = {ctx.flexible}",
    ]
    if ctx.kind() != "header":
        lines.append(f"    __api_key__: ClassVar[i16] = i16({ctx.schema['apiKey']})")
        lines.append(f"    __header_schema__: ClassVar[type[{ctx.header_class}]] = {ctx.header_class}")
    for field in fields:
        versions = Versions(field.get("versions") or field.get("taggedVersions"))
        if ctx.version not in versions:
            continue
        lines += render_schema_field(field, ctx)
    ctx.classes.append("\n".join(lines))


def render_schema_field(field: dict, ctx: Context) -> list[str]:
    version = ctx.version
    tag = field.get("tag") if version in Versions(field.get("taggedVersions")) else None
    if tag is not None and not ctx.flexible:
        raise ValueError(f"tagged field {field['name']} in a non-flexible version")
    name = python_field_name(field)
    about = field.get("about")
    type_ = field["type"]
    is_array = type_.startswith("[]")
    inner = type_.removeprefix("[]")
    nullable = version in Versions(field.get("nullableVersions"))
    if inner not in PRIMITIVE_HINTS:  # a struct, inline or common
        struct, nested = struct_fields(field, ctx)
        generate_class(struct, nested, ctx, "nested")
        if is_array:
            hint = f"tuple[{struct}, ...]" + (" | None" if nullable else "")
            kwargs = [("metadata", f'{{"tag": {tag}}}'), ("default", "()")] if tag is not None else []
            if nullable and tag is not None:
                kwargs = [("metadata", f'{{"tag": {tag}}}'), ("default", "None")]
        else:
            hint = struct + (" | None" if nullable else "")
            kwargs = []
            if tag is not None:
                kwargs = [("metadata", f'{{"tag": {tag}}}'), ("default", "None" if nullable else f"{struct}()")]
            elif str(field.get("default")) == "null":
                kwargs = [("default", "None")]
        return render_field(name, hint, kwargs, about)

    kafka_type = field_kafka_type({**field, "type": inner})
    entity = ENTITY_TYPES.get(field.get("entityType", ""))
    base_hint = entity or PRIMITIVE_HINTS[kafka_type]
    if entity:
        ctx.imports.add(f"from kio.schema.types import {entity}")
    elif base_hint in PRIMITIVE_IMPORTS:
        ctx.imports.add(f"from kio.static.primitive import {base_hint}")
    if kafka_type == "error_code":
        ctx.imports.add("from kio.schema.errors import ErrorCode")
    if kafka_type == "uuid":
        ctx.imports.add("import uuid")
    metadata = f'{{"kafka_type": "{kafka_type}"' + (f', "tag": {tag}' if tag is not None else "") + "}"
    if is_array:
        hint = f"tuple[{base_hint}, ...]" + (" | None" if nullable else "")
        return render_field(name, hint, [("metadata", metadata), ("default", "()")], about)
    optional = is_nullable(field, kafka_type, version, tag is not None)
    hint = base_hint if not optional or base_hint.endswith("| None") else f"{base_hint} | None"
    kwargs = [("metadata", metadata)]
    if "default" in field and not (kafka_type == "datetime_i64" and optional):
        kwargs.append(("default", format_default(kafka_type, field["default"], base_hint, ctx)))
    elif optional and (tag is not None or kafka_type == "datetime_i64"):
        kwargs.append(("default", "None"))
    elif tag is not None:
        kwargs.append(("default", implicit_default(kafka_type, base_hint, ctx)))
    return render_field(name, hint, kwargs, about)


def kio_has(schema: dict, version: int) -> bool:
    try:
        if schema["type"] == "request":
            load_request_schema(schema["apiKey"], version)
        elif schema["type"] == "response":
            load_response_schema(schema["apiKey"], version)
        else:
            load_entity_schema(api_module_name(schema), version, EntityType.header)
    except (UnknownAPIKey, UnknownEntity, ImportError):
        return False
    return True


def header_import(schema: dict, version: int, flexible: bool) -> tuple[str, str]:
    if schema["type"] == "response":
        header = 1 if flexible and schema["apiKey"] != 18 else 0
        return "ResponseHeader", f"from kio.schema.response_header.v{header}.header import ResponseHeader"
    if schema["apiKey"] == 7 and version == 0:  # ControlledShutdown v0 has no client id
        return "RequestHeader", "from ottla.protocol.legacy.request_header.v0.header import RequestHeader"
    header = 2 if flexible else 1
    return "RequestHeader", f"from kio.schema.request_header.v{header}.header import RequestHeader"


def render_module(schema: dict, version: int) -> tuple[str, str]:
    flexible = version in Versions(schema.get("flexibleVersions"))
    kind = schema["type"]
    header_class, header_line = header_import(schema, version, flexible) if kind != "header" else ("", "")
    common = {struct["name"]: struct for struct in schema.get("commonStructs", [])}
    ctx = Context(schema, version, flexible, header_class, common, [], set(), set())
    ctx.imports.add("from kio.static.constants import EntityType")
    ctx.imports.add("from kio.static.primitive import i16")
    if header_line:
        ctx.imports.add(header_line)
    entity_kind = {"request": "request", "response": "response", "header": "header"}[kind]
    generate_class(schema["name"], schema["fields"], ctx, entity_kind)
    stdlib = sorted(line for line in ctx.imports if line.startswith("import "))
    natural = lambda line: [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", line)]  # noqa: E731
    third = sorted((line for line in ctx.imports if line.startswith("from ")), key=natural)
    doc = (
        '"""\nGenerated from ``' + SOURCE.format(name=schema["name"]) + f"`` (Apache Kafka {KAFKA_VERSION}),\n"
        f"version {version}, by ``scripts/generate_legacy_schemas.py``. Do not edit.\n" + '"""\n'
    )
    dataclass_imports = ["from dataclasses import dataclass", "from dataclasses import field",
                         "from typing import ClassVar"]
    head = "\n\n".join("\n".join(group) for group in (stdlib, dataclass_imports, third) if group)
    body = "\n\n\n".join(ctx.classes)
    return schema["name"], f"{doc}\n{head}\n\n\n{body}\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("schema_dir", type=Path, help="directory holding Kafka 3.9's *.json message schemas")
    args = parser.parse_args()
    schemas = [load_json(path) for path in sorted(args.schema_dir.glob("*.json"))]
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    (OUT / "__init__.py").write_text(
        '"""Protocol classes kio 0.6 lacks, generated from Kafka 3.9\'s message schemas by\n'
        '``scripts/generate_legacy_schemas.py``: the ZooKeeper-era controller APIs and the\n'
        'versions KIP-896 removed. ``index`` maps (api key, version) to them."""\n'
    )
    index: dict[str, dict[tuple[int, int], str]] = {"request": {}, "response": {}}
    modules: dict[Path, list[str]] = {}
    for schema in schemas:
        kind = schema["type"]
        for version in Versions(schema["validVersions"]):
            if kio_has(schema, version):
                continue
            class_name, text = render_module(schema, version)
            package = OUT / api_module_name(schema)
            version_dir = package / f"v{version}"
            version_dir.mkdir(parents=True, exist_ok=True)
            (package / "__init__.py").touch()
            module = "header" if kind == "header" else kind
            (version_dir / f"{module}.py").write_text(text)
            modules.setdefault(version_dir, []).append(f"from .{module} import {class_name}")
            dotted = f"ottla.protocol.legacy.{api_module_name(schema)}.v{version}.{module}"
            if kind in index:
                index[kind][(schema["apiKey"], version)] = f"{dotted}:{class_name}"
            print(f"{schema['name']} v{version} -> {dotted}")
    for version_dir, imports in modules.items():
        names = [line.split()[-1] for line in sorted(imports)]
        all_ = "".join(f'    "{name}",\n' for name in names)
        (version_dir / "__init__.py").write_text("\n".join(sorted(imports)) + f"\n\n__all__ = (\n{all_})\n")
    lines = ['"""(api key, version) -> "module:Class" for every generated request and response."""', ""]
    for kind in ("request", "response"):
        lines.append(f"{kind.upper()}S = {{")
        for (key, version), path in sorted(index[kind].items()):
            lines.append(f'    ({key}, {version}): "{path}",')
        lines.append("}")
        lines.append("")
    (OUT / "index.py").write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
