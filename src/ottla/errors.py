"""Errors carry Kafka's own error codes so every layer can answer in the protocol's terms."""

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode", "KafkaError", "InvalidRecords", "ConfigError"]


class KafkaError(Exception):
    """Raised by the core (log, producer state, coordinators) with the code the client must see."""

    def __init__(self, code: ErrorCode, message: str | None = None):
        super().__init__(message or code.name)
        self.code = code
        self.message = message


class InvalidRecords(KafkaError):
    """INVALID_RECORD naming the records at fault (KIP-467), so Produce v8+ can tell the
    client which records of the batch to fail; `record_errors` is [(batch index, message)]."""

    def __init__(self, record_errors: list[tuple[int, str]]):
        shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in record_errors[:3])
        super().__init__(ErrorCode.invalid_record,
                         f"One or more records have been rejected due to {len(record_errors)} record errors "
                         f"in total, and only showing the first three errors at most: [{shown}]")
        self.record_errors = record_errors


class DataDirError(OSError):
    """The data directory cannot be served as it is (a corrupt topic file, an internal topic
    whose partition count the configuration contradicts): `ottla serve` prints the message as
    one line and exits 1, as Kafka stops when its last log directory fails to load."""


class ConfigError(ValueError):
    """A bad broker or topic configuration value, reported to the user verbatim."""
