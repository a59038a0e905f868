"""Parse and check the data source options once, on the driver, so a bad one fails the query at start.

Option names and value formats are those of Spark's built-in Kafka source and sink, so a job can move
between the two by changing the format name. Spark hands options over lower-cased; lookups here go
through its case-insensitive mapping.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Mapping

EARLIEST = -2
"""Offset sentinel of Spark's offsets JSON: the log start of the partition."""
LATEST = -1
"""Offset sentinel of Spark's offsets JSON: the end of what the isolation level lets us read."""
FETCH_OFFSET_NUM_RETRIES = 3
"""Spark's Kafka source default for `fetchOffset.numRetries`."""
FETCH_OFFSET_RETRY_INTERVAL_MS = 10
"""Spark's Kafka source default for `fetchOffset.retryIntervalMs`."""

TopicPartitionOffsets = dict[tuple[str, int], int]


class OptionError(ValueError):
    """An option the user must fix; the message says which and why."""


class DataLossError(RuntimeError):
    """Offsets the query must read are gone (deleted by retention, or the topic was recreated)."""


@dataclass(frozen=True)
class Subscription:
    """Which topic-partitions to read: exactly one of Spark's `subscribe`, `subscribePattern`, `assign`."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[tuple[str, int], ...] = ()

    def describe(self) -> str:
        if self.pattern is not None:
            return f"subscribePattern={self.pattern!r}"
        if self.assigned:
            return f"assign={sorted(self.assigned)!r}"
        return f"subscribe={list(self.topics)!r}"


@dataclass(frozen=True)
class ReadOptions:
    client: dict[str, str]
    subscription: Subscription
    starting: str | TopicPartitionOffsets | None
    ending: str | TopicPartitionOffsets | None
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    max_records_per_partition: int | None
    include_headers: bool
    fail_on_data_loss: bool
    poll_timeout_s: float
    read_committed: bool
    fetch_offset_num_retries: int | None
    """Streaming only (None when not given): how many times an end offset below one already read is read again."""
    fetch_offset_retry_interval_ms: int | None


@dataclass(frozen=True)
class WriteOptions:
    client: dict[str, str]
    topic: str | None
    exactly_once: bool
    marker_topic: str | None
    transactional_id_prefix: str
    timeout_s: float


# Client settings the source or sink must own; letting users set them would break its guarantees.
_READER_OWNED = {"enable.auto.commit", "auto.offset.reset", "enable.partition.eof"}
_WRITER_OWNED = {"transactional.id"}
_READ_OPTIONS = {"subscribe", "subscribepattern", "assign", "startingoffsets", "endingoffsets",
                 "maxoffsetspertrigger", "minpartitions", "maxrecordsperpartition", "includeheaders",
                 "failondataloss", "kafkaconsumer.polltimeoutms", "fetchoffset.numretries",
                 "fetchoffset.retryintervalms"}
_WRITE_OPTIONS = {"topic", "deliveryguarantee", "markertopic", "transactionalidprefix", "timeoutms"}


def client_config(options: Mapping[str, str], owned: set[str]) -> dict[str, str]:
    """The `kafka.*` options with the prefix removed: librdkafka settings passed through as given."""
    config = {key[len("kafka."):]: str(value) for key, value in options.items()
              if key.lower().startswith("kafka.")}
    if not config.get("bootstrap.servers"):
        raise OptionError("option 'kafka.bootstrap.servers' is required (e.g. 'localhost:9092')")
    clash = sorted(owned & config.keys())
    if clash:
        raise OptionError(f"option(s) {', '.join('kafka.' + k for k in clash)} cannot be set: "
                          "the Ottla data source manages them itself")
    return config


def parse_read_options(options: Mapping[str, str]) -> ReadOptions:
    _reject_unknown(options, _READ_OPTIONS)
    client = client_config(options, _READER_OWNED)
    # Kept apart from the client settings: the driver's admin client would warn about a consumer property.
    isolation = client.pop("isolation.level", "read_committed")
    _check_plaintext(client)
    if isolation not in ("read_committed", "read_uncommitted"):
        raise OptionError("option 'kafka.isolation.level' must be 'read_committed' or 'read_uncommitted', "
                          f"not {isolation!r}")
    return ReadOptions(
        client=client,
        read_committed=isolation == "read_committed",
        subscription=_subscription(options),
        starting=_offsets_option(options, "startingOffsets", allowed=("earliest", "latest"),
                                 sentinels=(EARLIEST, LATEST)),
        ending=_offsets_option(options, "endingOffsets", allowed=("latest",), sentinels=(LATEST,)),
        max_offsets_per_trigger=_positive_int(options, "maxOffsetsPerTrigger"),
        min_partitions=_positive_int(options, "minPartitions"),
        max_records_per_partition=_positive_int(options, "maxRecordsPerPartition"),
        include_headers=_bool(options, "includeHeaders", False),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        poll_timeout_s=(_positive_int(options, "kafkaConsumer.pollTimeoutMs") or 120_000) / 1000,
        fetch_offset_num_retries=_non_negative_int(options, "fetchOffset.numRetries"),
        fetch_offset_retry_interval_ms=_non_negative_int(options, "fetchOffset.retryIntervalMs"),
    )


def parse_write_options(options: Mapping[str, str], *, streaming: bool) -> WriteOptions:
    _reject_unknown(options, _WRITE_OPTIONS)
    client = client_config(options, _WRITER_OWNED)
    guarantee = options.get("deliveryGuarantee", "exactly_once" if streaming else "at_least_once")
    if guarantee not in ("exactly_once", "at_least_once"):
        raise OptionError(f"option 'deliveryGuarantee' must be 'exactly_once' or 'at_least_once', not {guarantee!r}")
    exactly_once = guarantee == "exactly_once"
    if exactly_once and not streaming:
        raise OptionError("deliveryGuarantee 'exactly_once' applies to streaming writes; a batch write is "
                          "at-least-once (a retried task writes its rows again)")
    topic = options.get("topic") or None
    marker_topic = options.get("markerTopic") or topic
    if exactly_once and marker_topic is None:
        raise OptionError("an exactly-once streaming write needs option 'topic' or 'markerTopic': the sink "
                          "records which micro-batches it wrote as consumer-group offsets on partition 0 "
                          "of that topic")
    return WriteOptions(
        client=client,
        topic=topic,
        exactly_once=exactly_once,
        marker_topic=marker_topic,
        transactional_id_prefix=options.get("transactionalIdPrefix", "ottla-spark-"),
        timeout_s=(_positive_int(options, "timeoutMs") or 60_000) / 1000,
    )


def _check_plaintext(client: dict[str, str]) -> None:
    """The reader's own Fetch client (fetch.py) connects in PLAINTEXT: refuse what it cannot honour."""
    if client.get("security.protocol", "plaintext").lower() != "plaintext" or \
            any(key.startswith(("sasl.", "ssl.")) for key in client):
        raise OptionError("the ottla source connects in PLAINTEXT only: option 'kafka.security.protocol' must "
                          "be PLAINTEXT and no 'kafka.ssl.*' or 'kafka.sasl.*' option may be set")


def _reject_unknown(options: Mapping[str, str], known: set[str]) -> None:
    """Catch typos such as `startingOffset`: Spark would silently ignore them."""
    unknown = sorted(k for k in options if not k.lower().startswith("kafka.") and k.lower() not in known
                     and k.lower() not in ("path", "checkpointlocation"))
    if unknown:
        raise OptionError(f"unknown option(s) {', '.join(map(repr, unknown))}; client settings take the "
                          "'kafka.' prefix")


def _subscription(options: Mapping[str, str]) -> Subscription:
    given = [name for name in ("subscribe", "subscribePattern", "assign") if options.get(name)]
    if len(given) != 1:
        raise OptionError("exactly one of the options 'subscribe', 'subscribePattern' and 'assign' must be "
                          f"set; got {given or 'none'}")
    value = options[given[0]]
    if given[0] == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise OptionError(f"option 'subscribe' names no topic: {value!r}")
        return Subscription(topics=topics)
    if given[0] == "subscribePattern":
        try:
            re.compile(value)
        except re.error as e:
            raise OptionError(f"option 'subscribePattern' is not a valid regular expression: {e}") from None
        return Subscription(pattern=value)
    parsed = _json(value, "assign", 'like {"topicA":[0,1],"topicB":[2,4]}')
    if not isinstance(parsed, dict) or not parsed or not all(
            isinstance(p, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in p)
            for p in parsed.values()):
        raise OptionError(f'option \'assign\' must map topics to partition lists, like {{"topicA":[0,1]}}; '
                          f"got {value!r}")
    return Subscription(assigned=tuple(sorted({(t, p) for t, ps in parsed.items() for p in ps})))


def _offsets_option(options: Mapping[str, str], name: str, *, allowed: tuple[str, ...],
                    sentinels: tuple[int, ...]) -> str | TopicPartitionOffsets | None:
    """None when not given: batch and streaming reads default differently, as in Spark."""
    if name not in options:
        return None
    value = options[name].strip()
    if value.lower() in allowed:
        return value.lower()
    if not value.startswith("{"):
        raise OptionError(f"option {name!r} must be {' or '.join(map(repr, allowed))} or a JSON object like "
                          f'{{"topicA":{{"0":23,"1":-2}}}}; got {value!r}')
    parsed = _json(value, name, '{"topicA":{"0":23,"1":-2}}')
    offsets: TopicPartitionOffsets = {}
    if not isinstance(parsed, dict):
        raise OptionError(f"option {name!r} must be a JSON object of topics; got {value!r}")
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise OptionError(f"option {name!r}: topic {topic!r} must map partition numbers to offsets")
        for partition, offset in partitions.items():
            if not partition.isdigit() or not isinstance(offset, int) or isinstance(offset, bool) or (
                    offset < 0 and offset not in sentinels):
                raise OptionError(f"option {name!r}: bad entry {topic!r}: {{{partition!r}: {offset!r}}}; offsets "
                                  f"are >= 0 or one of {list(sentinels)} ({_sentinel_names(sentinels)})")
            offsets[(topic, int(partition))] = offset
    return offsets


def _sentinel_names(sentinels: tuple[int, ...]) -> str:
    return ", ".join({EARLIEST: "-2 = earliest", LATEST: "-1 = latest"}[s] for s in sentinels)


def _json(value: str, name: str, example: str):
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise OptionError(f"option {name!r} is not valid JSON ({e}); expected something like {example}") from None


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    return _int_from(options, name, 1, "a positive integer")


def _non_negative_int(options: Mapping[str, str], name: str) -> int | None:
    return _int_from(options, name, 0, "a non-negative integer")


def _int_from(options: Mapping[str, str], name: str, lowest: int, what: str) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = lowest - 1
    if number < lowest:
        raise OptionError(f"option {name!r} must be {what}, not {value!r}")
    return number


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = str(options.get(name, default)).lower()
    if value not in ("true", "false"):
        raise OptionError(f"option {name!r} must be 'true' or 'false', not {options[name]!r}")
    return value == "true"
