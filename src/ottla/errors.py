"""Errors carry Kafka's own error codes so every layer can answer in the protocol's terms."""

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode", "KafkaError", "ConfigError"]


class KafkaError(Exception):
    """Raised by the core (log, producer state, coordinators) with the code the client must see."""

    def __init__(self, code: ErrorCode, message: str | None = None):
        super().__init__(message or code.name)
        self.code = code
        self.message = message


class ConfigError(ValueError):
    """A bad broker or topic configuration value, reported to the user verbatim."""
