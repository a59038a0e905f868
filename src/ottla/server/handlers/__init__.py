"""One module per Kafka API (Redpanda style). Each defines API_KEY, VERSIONS and `handle`."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

HANDLER_MODULES = [
    "api_versions",
    "metadata",
    "produce",
    "fetch",
    "list_offsets",
    "offset_for_leader_epoch",
    "create_topics",
    "delete_topics",
    "delete_records",
    "create_partitions",
    "describe_configs",
    "incremental_alter_configs",
    "alter_configs",
    "describe_cluster",
    "init_producer_id",
    "describe_producers",
    "find_coordinator",
    "join_group",
    "sync_group",
    "heartbeat",
    "leave_group",
    "offset_commit",
    "offset_fetch",
    "list_groups",
    "describe_groups",
    "delete_groups",
    "offset_delete",
    "add_partitions_to_txn",
    "add_offsets_to_txn",
    "end_txn",
    "txn_offset_commit",
    "write_txn_markers",
    "list_transactions",
    "describe_transactions",
    "leader_and_isr",
    "stop_replica",
    "update_metadata",
    "controlled_shutdown",
    "elect_leaders",
    "alter_partition_reassignments",
    "list_partition_reassignments",
    "consumer_group_heartbeat",
    "create_acls",
    "describe_acls",
    "delete_acls",
    "describe_log_dirs",
    "list_config_resources",
    "describe_topic_partitions",
    "describe_user_scram_credentials",
    "alter_user_scram_credentials",
]


@dataclass(frozen=True, slots=True)
class Handler:
    api_key: int
    min_version: int
    max_version: int
    handle: Callable[[Any, Any], Awaitable[Any]]


def load_handlers(modules: list[str] = HANDLER_MODULES) -> dict[int, Handler]:
    handlers = {}
    for name in modules:
        module = importlib.import_module(f"{__name__}.{name}")
        low, high = module.VERSIONS
        handlers[module.API_KEY] = Handler(module.API_KEY, low, high, module.handle)
    return handlers
