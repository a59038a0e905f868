"""GROUP config resources (KIP-848): per-group configs, under Kafka 4.1's names (`GroupConfig`).

A group's configs override the broker's `group.<name>` defaults; a value is checked against
Kafka's ConfigDef range and then against the broker's min/max (`group.consumer.min.session.
timeout.ms`, ...), and a session timeout must exceed its heartbeat interval, all as Kafka's
`GroupConfig.validate` does. Unknown names are INVALID_CONFIG, as in Kafka.

Kafka applies these to consumer (KIP-848), share and streams groups; its classic groups take
their session timeout from JoinGroup and ignore them. Ottla runs classic groups only, so it
stores and describes them (tools that set them keep working) and reports each name, once, as
not applied (`report_not_applied`) - never accepted and silently ignored.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Mapping

from .config import BROKER_CONFIGS, BrokerConfig, ConfigDef, broker_synonyms, render
from .errors import ConfigError

__all__ = ["GROUP_CONFIGS", "GroupConfig", "validate_group_configs"]

_log = logging.getLogger("ottla.config")

_ISO_DURATION = re.compile(r"P(?:\d+D)?(?:T(?:\d+H)?(?:\d+M)?(?:\d+(?:\.\d+)?S)?)?", re.IGNORECASE)


def _auto_offset_reset(value: str) -> str:
    """earliest, latest or by_duration:<ISO-8601 duration, not negative> (KIP-1106)."""
    lowered = str(value).strip().lower()
    if lowered in ("earliest", "latest"):
        return str(value)
    if lowered.startswith("by_duration:"):
        duration = lowered[len("by_duration:"):]
        if duration not in ("p", "pt") and _ISO_DURATION.fullmatch(duration):
            return str(value)
    raise ValueError(f"expected earliest, latest or by_duration:<ISO-8601 duration>, got {value!r}")


def _isolation_level(value: str) -> str:
    if value not in ("read_committed", "read_uncommitted"):
        raise ValueError(f"expected read_committed or read_uncommitted, got {value!r}")
    return value


def _int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    number = int(value)
    if not -2**31 <= number < 2**31:
        raise ValueError("not a number of type INT")
    return number


# Kafka 4.1's GroupConfig: name, type, Kafka's own default and ConfigDef minimum.
GROUP_CONFIGS: dict[str, ConfigDef] = {d.name: d for d in [
    ConfigDef("consumer.session.timeout.ms", _int, 45000, 1),
    ConfigDef("consumer.heartbeat.interval.ms", _int, 5000, 1),
    ConfigDef("share.session.timeout.ms", _int, 45000, 1),
    ConfigDef("share.heartbeat.interval.ms", _int, 5000, 1),
    ConfigDef("share.record.lock.duration.ms", _int, 30000, 1000),
    ConfigDef("share.auto.offset.reset", _auto_offset_reset, "latest"),
    ConfigDef("share.isolation.level", _isolation_level, "read_uncommitted"),
    ConfigDef("streams.session.timeout.ms", _int, 45000, 1),
    ConfigDef("streams.heartbeat.interval.ms", _int, 5000, 1),
    ConfigDef("streams.num.standby.replicas", _int, 0, 0),
]}
# Kafka's DescribeConfigs ConfigType codes of the group configs.
CONFIG_TYPES = {name: 3 if d.parse is _int else 2 for name, d in GROUP_CONFIGS.items()}

# The broker's bounds for each group config (Kafka's GroupConfig.validateValues).
_BOUNDS = {
    name: (f"group.{kind}.min.{what}", f"group.{kind}.max.{what}")
    for kind in ("consumer", "share", "streams")
    for name, what in ((f"{kind}.session.timeout.ms", "session.timeout.ms"),
                       (f"{kind}.heartbeat.interval.ms", "heartbeat.interval.ms"))
} | {"share.record.lock.duration.ms": ("group.share.min.record.lock.duration.ms",
                                       "group.share.max.record.lock.duration.ms"),
     "streams.num.standby.replicas": (None, "group.streams.max.standby.replicas")}

_reported: set[str] = set()


def broker_synonym(name: str) -> str | None:
    """The broker config that supplies a group config's default (Kafka: `group.` + name)."""
    synonym = "group." + name
    return synonym if synonym in BROKER_CONFIGS else None


def validate_group_configs(configs: Mapping[str, Any], broker: BrokerConfig) -> dict[str, Any]:
    """A group's whole set of configs checked as Kafka's GroupConfig.validate: names, types
    and ranges, the broker's min/max, and each session timeout above its heartbeat interval.
    Raises ConfigError with Kafka's message (INVALID_CONFIG)."""
    for name in configs:
        if name not in GROUP_CONFIGS:
            raise ConfigError(f"Unknown group config name: {name}")
    parsed = {name: GROUP_CONFIGS[name].coerce(raw) for name, raw in configs.items()}
    effective = GroupConfig(broker, parsed)
    for name, (low, high) in _BOUNDS.items():
        value = effective[name]
        if low is not None and value < broker[low]:
            raise ConfigError(f"{name} must be greater than or equal to {low}")
        if value > broker[high]:
            raise ConfigError(f"{name} must be less than or equal to {high}")
    for kind in ("consumer", "share", "streams"):
        if effective[f"{kind}.session.timeout.ms"] <= effective[f"{kind}.heartbeat.interval.ms"]:
            raise ConfigError(f"{kind}.session.timeout.ms must be greater than {kind}.heartbeat.interval.ms")
    return parsed


def report_not_applied(names) -> None:
    """Log, once per name, that a group config is stored but has nothing to act on."""
    for name in sorted(set(names) - _reported):
        _reported.add(name)
        _log.warning("group config %s is accepted and stored but not applied by Ottla: it applies to %s groups "
                     "(KIP-848), which Ottla does not run; classic groups take their session timeout from "
                     "JoinGroup, as in Kafka", name, name.split(".")[0])


class GroupConfig:
    """A group's effective configs: its own settings over the broker's `group.*` defaults.
    Stored values are parsed, not range-checked (Kafka's GroupConfig.fromProps): a broker
    restarted with narrower bounds still describes what was stored."""

    def __init__(self, broker: BrokerConfig, overrides: Mapping[str, Any] | None = None):
        self.broker = broker
        self.overrides = {name: GROUP_CONFIGS[name].coerce(raw) for name, raw in (overrides or {}).items()
                          if name in GROUP_CONFIGS}

    def __getitem__(self, name: str) -> Any:
        if name in self.overrides:
            return self.overrides[name]
        synonym = broker_synonym(name)
        return self.broker[synonym] if synonym else GROUP_CONFIGS[name].default

    def synonyms(self, name: str) -> list[tuple[str, str | None, str]]:
        """Kafka's createGroupConfigEntry: the group's own setting, then the broker synonym's
        layers, or (no synonym) a default under the group config's own name."""
        synonym = broker_synonym(name)
        if synonym is not None:
            found = broker_synonyms(self.broker, synonym)
        else:
            found = [(name, render(GROUP_CONFIGS[name].default), "default")]
        if name in self.overrides:
            found.insert(0, (name, render(self.overrides[name]), "group"))
        return found
