"""The topic settings a Log append reads, resolved once per config change, and the checks a
produced batch passes with them before it gets offsets (Kafka's LogValidator)."""

from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple

from ..config import TopicConfig
from ..errors import ErrorCode, InvalidRecords, KafkaError
from ..records.batch import BatchHeader, parse_batches, validate_client_batch
from ..records.compression import CODEC_IDS
from ..records.records import decode_batch, keys_present, rebuild_batch
from ..records.validator import BeyondInline, check_records, inflate_limit

__all__ = ["AppendSettings", "Validated", "ValidateElsewhere", "check_create_times", "validate", "validate_produced"]


class AppendSettings:
    """The topic configs every append reads, resolved once per config change: a TopicConfig
    lookup walks overrides and broker synonyms, too slow for tens of thousands of appends/s."""

    __slots__ = (
        "max_message_bytes",
        "compacted",
        "target_codec",
        "log_append_time",
        "timestamp_before_max_ms",
        "timestamp_after_max_ms",
        "segment_bytes",
        "segment_ms",
        "flush_messages",
        "flush_ms",
    )

    def __init__(self, config: TopicConfig):
        self.max_message_bytes = config["max.message.bytes"]
        self.compacted = "compact" in config["cleanup.policy"]
        target = config["compression.type"]
        self.target_codec = None if target == "producer" else CODEC_IDS[target]
        self.log_append_time = config["message.timestamp.type"] == "LogAppendTime"
        self.timestamp_before_max_ms = config["message.timestamp.before.max.ms"]
        self.timestamp_after_max_ms = config["message.timestamp.after.max.ms"]
        self.segment_bytes = config["segment.bytes"]
        self.segment_ms = config["segment.ms"]
        self.flush_messages = config["flush.messages"]
        self.flush_ms = config["flush.ms"]


_UNBOUNDED_MS = 2**63 - 1


def check_create_times(buf, header: BatchHeader, now_ms: int, settings: AppendSettings) -> None:
    """Kafka's `message.timestamp.before.max.ms` / `after.max.ms` (KIP-937) for CreateTime
    topics: a stamp further in the past or future than allowed is INVALID_TIMESTAMP; records
    without a timestamp (-1) pass. The header's max timestamp bounds every record from above,
    so the default settings (no lower bound) never decode a record; a finite lower bound
    needs each record's stamp, and costs a decode on that topic only."""
    earliest = now_ms - settings.timestamp_before_max_ms
    latest = now_ms + settings.timestamp_after_max_ms
    stamp = header.max_timestamp
    if stamp <= latest and settings.timestamp_before_max_ms < _UNBOUNDED_MS:
        stamp = min((r.timestamp for r in decode_batch(buf, header) if r.timestamp >= 0), default=-1)
    if stamp >= 0 and not earliest <= stamp <= latest:
        raise KafkaError(ErrorCode.invalid_timestamp,
                         f"timestamp {stamp} is out of range: it must lie within [{earliest}, {latest}] "
                         f"(message.timestamp.before.max.ms / message.timestamp.after.max.ms)")


# A batch that must be decoded into records (recompression, a compacted topic's keys, a lower
# timestamp bound) is decoded inline only up to this many records: 10,000 records of 100 B
# took 90-180 ms to recompress, 1,000 took 12-20 ms.
_DECODED_INLINE = 500


class Validated(NamedTuple):
    """A produced batch as validation left it, for `Log.append`: what to write (recompressed if
    the topic asks), its headers, the settings it was checked under and the producer's bytes
    (checked again if the settings changed meanwhile); or the error to answer."""

    buf: object
    headers: list[BatchHeader] | None
    settings: AppendSettings
    produced: object
    error: KafkaError | None = None


class ValidateElsewhere(Exception):
    """The batch is more work than the caller does inline: `validate()` (in a worker thread: it
    touches nothing but its arguments) returns the `Validated` to hand to `Log.append`."""

    def __init__(self, validate: Callable[[], Validated]):
        super().__init__()
        self.validate = validate


def validate(records, now_ms: int, settings: AppendSettings, partition: str, inline: int | None = None) -> Validated:
    """A produced record set checked under `settings` (`validate_produced`); one validated
    already under the same settings is taken as it is. With `inline`, a batch whose records
    take more bytes than that (inflated), or that must be decoded and holds more than
    `_DECODED_INLINE` records, raises ValidateElsewhere instead of doing that work here."""
    if isinstance(records, Validated):
        if records.settings is settings:
            if records.error is not None:
                raise records.error
            return records
        records = records.produced
    headers = parse_batches(records, max_batch_bytes=settings.max_message_bytes)
    try:
        buf, headers = validate_produced(records, headers, now_ms, settings, partition, inline)
    except BeyondInline:
        raise ValidateElsewhere(partial(_validate_elsewhere, records, headers, now_ms, settings, partition)) from None
    return Validated(buf, headers, settings, records)


def _validate_elsewhere(records, headers, now_ms: int, settings: AppendSettings, partition: str) -> Validated:
    try:
        buf, headers = validate_produced(records, headers, now_ms, settings, partition)
    except KafkaError as exc:
        # Without the frames of the walk: what they hold (an inflated batch) is freed here,
        # not on the event loop.
        exc.__context__ = None
        return Validated(None, None, settings, records, exc.with_traceback(None))
    return Validated(buf, headers, settings, records)


def validate_produced(buf, headers: list[BatchHeader], now_ms: int, settings: AppendSettings, partition: str,
                      inline: int | None = None):
    """A produce request's record set (`headers` parsed from `buf`): exactly one batch, whose
    header, records, timestamps and keys the topic accepts. Returns the batch to append and
    its headers: recompressed when the topic's `compression.type` asks for another codec.
    BeyondInline when the work exceeds `inline` (see `validate`)."""
    if len(headers) != 1:
        raise KafkaError(ErrorCode.invalid_record, "a produce request carries exactly one batch per partition")
    validate_client_batch(headers[0])
    if inline is not None and headers[0].records_count > _DECODED_INLINE and _decodes(headers[0], settings):
        raise BeyondInline()
    check_records(buf, headers[0], inflate_limit(settings.max_message_bytes), inline)
    if not settings.log_append_time:
        check_create_times(buf, headers[0], now_ms, settings)
    if settings.compacted and not keys_present(buf, headers):
        message = f"Compacted topic cannot accept message without key in topic partition {partition}."
        raise InvalidRecords([(index, message) for index, record in enumerate(decode_batch(buf, headers[0]))
                              if record.key is None])
    target = settings.target_codec
    if target is not None and target != headers[0].compression:
        buf = bytearray(rebuild_batch(buf, headers[0], target))
        headers = parse_batches(buf)
    return buf, headers


def _decodes(header: BatchHeader, settings: AppendSettings) -> bool:
    """Whether `validate_produced` decodes the batch's records, not only walks them."""
    return (settings.compacted
            or settings.target_codec not in (None, header.compression)
            or (not settings.log_append_time and settings.timestamp_before_max_ms < _UNBOUNDED_MS))
