"""A small synchronous Kafka protocol client for the admin APIs librdkafka does not expose.

confluent-kafka has no ListTransactions, DescribeTransactions, DescribeProducers (KIP-664)
or WriteTxnMarkers, which `ottla transactions` and `ottla producers` need. kio supplies the
message classes; this module only frames requests, picks versions both sides speak (via
ApiVersions) and routes each request to the broker that must answer it: every broker for
ListTransactions, the transaction coordinator for DescribeTransactions, the partition
leader for DescribeProducers, WriteTxnMarkers and DescribeLogDirs (whose Ottla-only tag
carries compacted partitions' dirty ratios, which no Kafka API has). The Spark source's read
tasks send Fetch and ListOffsets through it too (spark/fetch.py): librdkafka hands out records
one object each, never the record batches.
"""

from __future__ import annotations

import io
import socket
import struct
from datetime import timedelta
from dataclasses import dataclass, field, make_dataclass
from functools import cache
from types import ModuleType
from typing import Any, Iterable

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import TZAware

from .protocol.build import has_field, make, nested
from .protocol.extensions import DESCRIBE_LOG_DIRS
from .protocol.schemas import api_name, request_schema, response_schema

__all__ = [
    "AdminProtocolClient",
    "BrokerError",
    "BrokerUnreachable",
    "Node",
    "PartitionInfo",
    "ProtocolClientError",
    "UnsupportedByBroker",
]

_SIZE = struct.Struct(">i")

FETCH = 1
LIST_OFFSETS = 2
API_VERSIONS = 18
METADATA = 3
FIND_COORDINATOR = 10
WRITE_TXN_MARKERS = 27
ALTER_PARTITION_REASSIGNMENTS = 45
LIST_PARTITION_REASSIGNMENTS = 46
DESCRIBE_PRODUCERS = 61
DESCRIBE_TRANSACTIONS = 65
LIST_TRANSACTIONS = 66

# Versions this client knows how to build and read, per API.
CLIENT_VERSIONS = {
    FETCH: (4, 12),  # read_committed and aborted transactions (v4) up to the last with topic names (v12)
    LIST_OFFSETS: (1, 7),
    METADATA: (1, 12),
    FIND_COORDINATOR: (1, 6),
    WRITE_TXN_MARKERS: (1, 2),
    DESCRIBE_LOG_DIRS: (2, 5),  # the flexible versions, which carry Ottla's dirty ratio
    ALTER_PARTITION_REASSIGNMENTS: (0, 0),
    LIST_PARTITION_REASSIGNMENTS: (0, 0),
    DESCRIBE_PRODUCERS: (0, 0),
    DESCRIBE_TRANSACTIONS: (0, 0),
    LIST_TRANSACTIONS: (0, 2),
}

TRANSACTION_KEY_TYPE = 1


class ProtocolClientError(Exception):
    """Anything that stops an admin request from completing."""


class BrokerUnreachable(ProtocolClientError):
    def __init__(self, address: str, reason: str):
        super().__init__(f"cannot reach broker at {address} ({reason})")


class UnsupportedByBroker(ProtocolClientError):
    def __init__(self, api_key: int, address: str):
        super().__init__(f"broker at {address} does not support {api_name(api_key)}")


class BrokerError(ProtocolClientError):
    """The broker answered with a Kafka error code."""

    def __init__(self, code: ErrorCode, context: str, message: str | None = None):
        text = f"{context}: {error_name(code)}"
        if message:
            text += f" ({message})"
        super().__init__(text)
        self.code = code


def error_name(code: int) -> str:
    """Kafka's spelling of an error code, e.g. UNKNOWN_TOPIC_OR_PARTITION."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"ERROR_{code}"


@dataclass(frozen=True, slots=True)
class Node:
    node_id: int
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    leader: int


@cache
def _request_module(api_key: int, version: int) -> ModuleType:
    return load_payload_module(api_key, version, EntityType.request)


def _readable_response(api_key: int, version: int) -> type:
    """The schema to read a response with.

    kio refuses negative timestamps, but DescribeTransactions carries a start time of -1 when
    no transaction is open; there the field is read as nullable, so -1 arrives as None.
    """
    schema = response_schema(api_key, version)
    if api_key != DESCRIBE_TRANSACTIONS:
        return schema
    flags = {"frozen": True, "slots": True, "kw_only": True}
    start_time = field(metadata={"kafka_type": "datetime_i64"})
    state = make_dataclass("TransactionState", [("transaction_start_time", TZAware | None, start_time)],
                           bases=(nested(schema, "TransactionState"),), **flags)
    return make_dataclass(schema.__name__, [("transaction_states", tuple[state, ...])], bases=(schema,), **flags)


@cache
def _codec(api_key: int, version: int):
    request = request_schema(api_key, version)
    response = _readable_response(api_key, version)
    return (request.__header_schema__, entity_writer(request.__header_schema__), entity_writer(request),
            entity_reader(response.__header_schema__), entity_reader(response))


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise ProtocolClientError(f"bad broker address {address!r} (want HOST:PORT)")
    return host.strip("[]"), int(port)


class BrokerConnection:
    """One blocking socket to one broker; learns the broker's API versions on connect."""

    def __init__(self, host: str, port: int, *, timeout: float, client_id: str):
        self.address = f"{host}:{port}"
        self._client_id = client_id
        self._correlation_id = 0
        try:
            self._socket = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise BrokerUnreachable(self.address, exc.strerror or str(exc)) from None
        self._socket.settimeout(timeout)
        try:
            self.versions = self._api_versions()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._socket.close()

    def version_for(self, api_key: int) -> int:
        """Highest version both this client and the broker speak."""
        low, high = CLIENT_VERSIONS[api_key]
        offered = self.versions.get(api_key)
        if offered is None or offered[1] < low or offered[0] > high:
            raise UnsupportedByBroker(api_key, self.address)
        return min(high, offered[1])

    def request(self, api_key: int, build) -> Any:
        """Send `build(schema_module)` at the negotiated version and return the response."""
        version = self.version_for(api_key)
        return self.send(api_key, version, build(_request_module(api_key, version)))

    def send(self, api_key: int, version: int, body: Any) -> Any:
        return self.receive(api_key, version, self.submit(api_key, version, body))

    def submit(self, api_key: int, version: int, body: Any) -> int:
        """Send a request without waiting for its answer (`receive` takes answers in the order sent);
        returns its correlation id."""
        header_schema, write_header, write_body, _, _ = _codec(api_key, version)
        self._correlation_id += 1
        out = io.BytesIO()
        out.write(b"\0\0\0\0")
        write_header(out, header_schema(request_api_key=api_key, request_api_version=version,
                                        correlation_id=self._correlation_id, client_id=self._client_id))
        write_body(out, body)
        frame = out.getbuffer()
        _SIZE.pack_into(frame, 0, len(frame) - 4)
        try:
            self._socket.sendall(frame)
        except OSError as exc:
            raise self._lost(exc) from None
        finally:
            del frame
        return self._correlation_id

    def receive(self, api_key: int, version: int, correlation_id: int) -> Any:
        """The answer to the submitted request `correlation_id`, the oldest not yet received."""
        _, _, _, read_header, read_body = _codec(api_key, version)
        try:
            payload = self._receive_frame()
        except socket.timeout:
            raise ProtocolClientError(f"broker at {self.address} did not answer "
                                      f"{api_name(api_key)} in time") from None
        except OSError as exc:
            raise self._lost(exc) from None
        header, offset = read_header(payload, 0)
        if header.correlation_id != correlation_id:
            raise ProtocolClientError(f"broker at {self.address} answered correlation id "
                                      f"{header.correlation_id}, expected {correlation_id}")
        response, _ = read_body(payload, offset)
        return response

    def _lost(self, exc: OSError) -> ProtocolClientError:
        return ProtocolClientError(f"lost the connection to broker at {self.address} ({exc.strerror or exc})")

    def _receive_frame(self) -> memoryview:
        (size,) = _SIZE.unpack(self._receive_exactly(4))
        return self._receive_exactly(size)

    def _receive_exactly(self, count: int) -> memoryview:
        """`count` bytes, received into one buffer: a large answer (a Fetch's record set) arrives in many
        pieces, which are then neither allocated apart nor copied again. Read-only, as kio's readers want."""
        buffer = memoryview(bytearray(count))
        received = 0
        while received < count:
            got = self._socket.recv_into(buffer[received:])
            if not got:
                raise ConnectionResetError(0, "connection closed by broker")
            received += got
        return buffer.toreadonly()

    def _api_versions(self) -> dict[int, tuple[int, int]]:
        """ApiVersions v3; a broker that lacks it answers UNSUPPORTED_VERSION in v0 form."""
        module = _request_module(API_VERSIONS, 3)
        try:
            response = self.send(API_VERSIONS, 3, module.ApiVersionsRequest(
                client_software_name="ottla-cli", client_software_version="0.1.0"))
            failed = response.error_code == ErrorCode.unsupported_version
        except ProtocolClientError:
            raise
        except Exception:  # kio fails in several ways on a v0-shaped answer read as v3
            failed = True
        if failed:
            response = self.send(API_VERSIONS, 0, _request_module(API_VERSIONS, 0).ApiVersionsRequest())
        if response.error_code != ErrorCode.none:
            raise BrokerError(response.error_code, f"ApiVersions to {self.address}")
        return {item.api_key: (item.min_version, item.max_version) for item in response.api_keys}


class AdminProtocolClient:
    """Routes admin requests to the right broker; use as a context manager."""

    def __init__(self, bootstrap: str, *, timeout: float = 5.0, client_id: str = "ottla-cli"):
        self._bootstrap = [address for address in bootstrap.split(",") if address.strip()]
        self._timeout = timeout
        self._client_id = client_id
        self._connections: dict[str, BrokerConnection] = {}
        self._nodes: dict[int, Node] = {}
        self._leaders: dict[tuple[str, int], int] = {}

    def __enter__(self) -> "AdminProtocolClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()

    def _connect(self, host: str, port: int) -> BrokerConnection:
        address = f"{host}:{port}"
        connection = self._connections.get(address)
        if connection is None:
            connection = BrokerConnection(host, port, timeout=self._timeout, client_id=self._client_id)
            self._connections[address] = connection
        return connection

    def any_connection(self) -> BrokerConnection:
        """A connection to some broker: one already open, else the first bootstrap server that answers."""
        if self._connections:
            return next(iter(self._connections.values()))
        failure: BrokerUnreachable | None = None
        for address in self._bootstrap:
            try:
                return self._connect(*split_address(address))
            except BrokerUnreachable as exc:
                failure = exc
        raise failure or ProtocolClientError("no bootstrap servers given")

    def missing_apis(self, api_keys: Iterable[int]) -> list[str]:
        """Names of the APIs among `api_keys` that the broker does not offer at all."""
        offered = self.any_connection().versions
        return [api_name(key) for key in api_keys if key not in offered]

    def connection_to(self, node: Node) -> BrokerConnection:
        """The connection to `node` as an answer named it (FindCoordinator gives host and port): no Metadata."""
        return self._connect(node.host, node.port)

    def node_connection(self, node_id: int) -> BrokerConnection:
        """The connection to broker `node_id`, learning the brokers from Metadata first if needed."""
        if node_id not in self._nodes:
            self.metadata([])
        node = self._nodes.get(node_id)
        if node is None:
            raise ProtocolClientError(f"broker {node_id} is not in the cluster metadata")
        return self._connect(node.host, node.port)

    def metadata(self, topics: Iterable[str] | None) -> dict[str, list[PartitionInfo]]:
        """Partition leaders of `topics` (all topics if None); also learns the brokers."""
        response = self.metadata_response(topics)
        result = {}
        for topic in response.topics:
            if topic.error_code == ErrorCode.unknown_topic_or_partition:
                raise ProtocolClientError(f"topic {topic.name!r} does not exist")
            if topic.error_code != ErrorCode.none:
                raise BrokerError(topic.error_code, f"topic {topic.name!r}")
            result[topic.name] = sorted(
                (PartitionInfo(p.partition_index, p.leader_id) for p in topic.partitions),
                key=lambda info: info.partition)
        return result

    def metadata_response(self, topics: Iterable[str] | None) -> Any:
        """The whole Metadata response (cluster id, controller, racks, leader epochs, ISR and
        offline replicas, which librdkafka does not expose); also learns the brokers."""
        names = None if topics is None else list(topics)

        def build(module):
            requested = None if names is None else tuple(
                make(module.MetadataRequestTopic, name=name, topic_id=None) for name in names)
            return make(module.MetadataRequest, topics=requested, allow_auto_topic_creation=False,
                        include_cluster_authorized_operations=False,
                        include_topic_authorized_operations=False)

        response = self.any_connection().request(METADATA, build)
        self._nodes = {b.node_id: Node(b.node_id, b.host, b.port) for b in response.brokers}
        return response

    def brokers(self) -> list[Node]:
        self.metadata([])
        return sorted(self._nodes.values(), key=lambda node: node.node_id)

    def _leader(self, topic: str, partition: int) -> int:
        partitions = self.metadata([topic])[topic]
        for info in partitions:
            if info.partition == partition:
                if info.leader < 0:
                    raise BrokerError(ErrorCode.leader_not_available, f"{topic}-{partition}")
                return info.leader
        raise ProtocolClientError(f"topic {topic!r} has no partition {partition}")

    def leader_connection(self, topic: str, partition: int) -> BrokerConnection:
        """The connection to a partition's leader, looked up once per client: a reader that finds the
        leader moved drops its client (the Spark source's `fetch.py`)."""
        leader = self._leaders.get((topic, partition))
        if leader is None:
            leader = self._leaders[(topic, partition)] = self._leader(topic, partition)
        return self.node_connection(leader)

    def find_transaction_coordinator(self, transactional_id: str) -> Node:
        def build(module):
            return make(module.FindCoordinatorRequest, key=transactional_id,
                        coordinator_keys=(transactional_id,), key_type=TRANSACTION_KEY_TYPE)

        response = self.any_connection().request(FIND_COORDINATOR, build)
        answer = response.coordinators[0] if hasattr(response, "coordinators") else response
        if answer.error_code != ErrorCode.none:
            raise BrokerError(answer.error_code, f"coordinator for {transactional_id!r}",
                              answer.error_message)
        return Node(answer.node_id, answer.host, answer.port)

    def list_transactions(self, *, states: Iterable[str] = (), producer_ids: Iterable[int] = (),
                          min_duration_ms: int = -1) -> list[Any]:
        """Every broker coordinates some transactions, so ask them all and merge."""
        state_filters, producer_id_filters = tuple(states), tuple(producer_ids)

        def build(module):
            if min_duration_ms >= 0 and not has_field(module.ListTransactionsRequest, "duration_filter"):
                raise ProtocolClientError("the broker cannot filter transactions by duration "
                                          "(that needs ListTransactions v1)")
            return make(module.ListTransactionsRequest, state_filters=state_filters,
                        producer_id_filters=producer_id_filters, duration_filter=min_duration_ms)

        listings = []
        for node in self.brokers():
            response = self._connect(node.host, node.port).request(LIST_TRANSACTIONS, build)
            if response.error_code != ErrorCode.none:
                raise BrokerError(response.error_code, f"ListTransactions on broker {node.node_id}")
            listings.extend(response.transaction_states)
        return sorted(listings, key=lambda state: state.transactional_id)

    def describe_transaction(self, transactional_id: str) -> tuple[Node, Any]:
        """The coordinator that owns `transactional_id`, and its view of the transaction."""
        coordinator = self.find_transaction_coordinator(transactional_id)

        def build(module):
            return module.DescribeTransactionsRequest(transactional_ids=(transactional_id,))

        response = self._connect(coordinator.host, coordinator.port).request(DESCRIBE_TRANSACTIONS, build)
        state = response.transaction_states[0]
        if state.error_code != ErrorCode.none:
            raise BrokerError(state.error_code, f"transaction {transactional_id!r}")
        return coordinator, state

    def describe_producers(self, topic: str, partitions: Iterable[int] | None = None
                           ) -> dict[int, tuple[Any, ...]]:
        """Active producers per partition, each asked of that partition's leader."""
        infos = self.metadata([topic])[topic]
        wanted = None if partitions is None else set(partitions)
        by_leader: dict[int, list[int]] = {}
        for info in infos:
            if wanted is None or info.partition in wanted:
                by_leader.setdefault(info.leader, []).append(info.partition)
        missing = (wanted or set()) - {info.partition for info in infos}
        if missing:
            raise ProtocolClientError(f"topic {topic!r} has no partition {min(missing)}")
        result: dict[int, tuple[Any, ...]] = {}
        for leader, indexes in by_leader.items():
            if leader < 0:
                raise BrokerError(ErrorCode.leader_not_available, f"{topic}-{indexes[0]}")

            def build(module, indexes=tuple(indexes)):
                return module.DescribeProducersRequest(
                    topics=(module.TopicRequest(name=topic, partition_indexes=indexes),))

            response = self.node_connection(leader).request(DESCRIBE_PRODUCERS, build)
            for topic_response in response.topics:
                for partition in topic_response.partitions:
                    if partition.error_code != ErrorCode.none:
                        raise BrokerError(partition.error_code, f"{topic}-{partition.partition_index}",
                                          partition.error_message)
                    result[partition.partition_index] = partition.active_producers
        return dict(sorted(result.items()))

    def dirty_ratios(self, topic: str, leaders: dict[int, int]) -> dict[int, float]:
        """partition -> dirty ratio, for the compacted partitions among `leaders` (partition ->
        leader id), each asked of its leader with DescribeLogDirs and Ottla's tag 10000
        (`protocol/extensions.py`). A broker that does not know the tag (Kafka) reports none."""
        by_leader: dict[int, list[int]] = {}
        for partition, leader in leaders.items():
            by_leader.setdefault(leader, []).append(partition)
        ratios: dict[int, float] = {}
        for leader, partitions in by_leader.items():
            connection = self.node_connection(leader)
            version = connection.version_for(DESCRIBE_LOG_DIRS)
            request_type = request_schema(DESCRIBE_LOG_DIRS, version)
            wanted = make(nested(request_type, "DescribableLogDirTopic"), topic=topic, partitions=tuple(partitions))
            response = connection.send(DESCRIBE_LOG_DIRS, version, make(request_type, topics=(wanted,),
                                                                        dirty_ratio=True))
            ratios.update((p.partition_index, p.dirty_ratio)
                          for result in response.results for t in result.topics if t.name == topic
                          for p in t.partitions if p.partition_index in partitions and p.dirty_ratio is not None)
        return dict(sorted(ratios.items()))

    def abort_transaction(self, topic: str, partition: int, *, producer_id: int, producer_epoch: int,
                          coordinator_epoch: int) -> None:
        """Write an ABORT marker for the producer's open transaction on one partition.

        This is what `kafka-transactions.sh abort` does for a hanging transaction whose
        coordinator has lost track of it: the partition leader takes the marker directly.
        """
        def build(module):
            marker_topic = module.WritableTxnMarkerTopic(name=topic, partition_indexes=(partition,))
            return module.WriteTxnMarkersRequest(markers=(make(
                module.WritableTxnMarker, producer_id=producer_id, producer_epoch=producer_epoch,
                transaction_result=False, topics=(marker_topic,), coordinator_epoch=coordinator_epoch),))

        response = self.node_connection(self._leader(topic, partition)).request(WRITE_TXN_MARKERS, build)
        for marker in response.markers:
            for topic_result in marker.topics:
                for result in topic_result.partitions:
                    if result.error_code != ErrorCode.none:
                        raise BrokerError(result.error_code,
                                          f"abort on {topic_result.name}-{result.partition_index}")

    def _controller_connection(self) -> BrokerConnection:
        controller = self.metadata_response([]).controller_id
        if controller < 0:
            raise BrokerError(ErrorCode.not_controller, "no controller is known")
        return self.node_connection(controller)

    def alter_partition_reassignment(self, topic: str, partition: int, replicas: list[int] | None,
                                     timeout_ms: int) -> None:
        """Start a reassignment to `replicas`, or cancel the ongoing one (None), on the controller.

        confluent-kafka has no AlterPartitionReassignments, hence this client."""
        def build(module):
            return module.AlterPartitionReassignmentsRequest(timeout=timedelta(milliseconds=timeout_ms), topics=(
                module.ReassignableTopic(name=topic, partitions=(module.ReassignablePartition(
                    partition_index=partition, replicas=None if replicas is None else tuple(replicas)),)),))

        response = self._controller_connection().request(ALTER_PARTITION_REASSIGNMENTS, build)
        if response.error_code != ErrorCode.none:
            raise BrokerError(response.error_code, "AlterPartitionReassignments", response.error_message)
        for topic_response in response.responses:
            for result in topic_response.partitions:
                if result.error_code != ErrorCode.none:
                    raise BrokerError(result.error_code, f"{topic_response.name}-{result.partition_index}",
                                      result.error_message)

    def list_partition_reassignments(self, timeout_ms: int) -> list[tuple[str, Any]]:
        """The ongoing reassignments, as (topic, OngoingPartitionReassignment), from the controller."""
        def build(module):
            return module.ListPartitionReassignmentsRequest(timeout=timedelta(milliseconds=timeout_ms),
                                                            topics=None)

        response = self._controller_connection().request(LIST_PARTITION_REASSIGNMENTS, build)
        if response.error_code != ErrorCode.none:
            raise BrokerError(response.error_code, "ListPartitionReassignments", response.error_message)
        return sorted(((topic.name, p) for topic in response.topics for p in topic.partitions),
                      key=lambda item: (item[0], item[1].partition_index))
