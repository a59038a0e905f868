"""What a handler knows about the request it serves, without any socket in sight."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..protocol.codec import response_schema

if TYPE_CHECKING:
    from .broker import Broker


class CloseConnection(Exception):
    """A handler's way to say "close this client's connection" (the reason is logged)."""


@dataclass(slots=True)
class RequestContext:
    broker: "Broker"
    api_key: int
    api_version: int
    header: Any
    connection_id: str
    peer_host: str = ""

    @property
    def client_host(self) -> str:
        """The client address as Kafka shows it (InetAddress.toString(): "/127.0.0.1")."""
        return f"/{self.peer_host}" if self.peer_host else ""

    @property
    def response_type(self) -> type:
        return response_schema(self.api_key, self.api_version)

    @property
    def principal(self) -> str:
        """Without SASL every client is Kafka's anonymous user."""
        return "User:ANONYMOUS"

    @property
    def client_id(self) -> str | None:
        return getattr(self.header, "client_id", None)
