"""Consumers that never read their responses (issue 11, load test): 200 of them held 1.6 GB
when every Fetch response was read into memory whole. A connection handles one request at a
time, and fetched records stay in the segment file until the socket takes them, so each
unread response holds at most one write slice in the broker."""

import socket
import time
from datetime import timedelta

from kafka import KafkaConsumer, TopicPartition
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from ottla.protocol.schemas import request_schema
from ottla.records.legacy import down_convert
from ottla.server.network import _WRITE_SLICE_BYTES
from tests.waiting import wait_for
from tests.wire import (
    decode_response,
    encode_request,
    process_memory,
    read_frame,
    roundtrip,
    stuck_consumers,
    unread_bytes,
)

TOPIC = "unread"
CONSUMERS = 200
BATCHES = 40  # of ~100 KB: a 4 MB log, every byte of it in each consumer's response
# What one unread response may hold in the broker: one slice read from the file, what the
# transport keeps before pausing (its 64 KiB high-water mark plus the last slice written)
# and the frame's small fields; rounded up to 1 MiB for allocator slack.
PER_CONNECTION_BOUND = max(1 << 20, 3 * _WRITE_SLICE_BYTES)


def _batch(i: int) -> bytes:
    """Always the same length: every record carries the timestamp read once for the batch. With
    the clock read per record (timestamp=None), a build descheduled for 64 ms or more gave the
    later records two-byte timestamp deltas, so the log was longer than BATCHES batches built
    here (by 13 bytes in a full run at load 20)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 22)
    timestamp = int(time.time() * 1000)
    for r in range(100):
        builder.append(r, timestamp=timestamp, key=None, value=bytes([i % 256, r % 256]) * 500, headers=[])
    return bytes(builder.build())


def _fetch_request(max_bytes: int = 2**31 - 1) -> FetchRequest:
    return FetchRequest(max_wait=timedelta(0), min_bytes=0, max_bytes=max_bytes, topics=(
        FetchTopic(topic=TOPIC, partitions=(
            FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=max_bytes),)),),
        forgotten_topics_data=())


def _records(frame: bytes) -> bytes:
    _, response = decode_response(frame, 1, 11)
    partition = response.responses[0].partitions[0]
    assert partition.error_code == ErrorCode.none
    return partition.records


def _batches(records: bytes):
    reader = MemoryRecords(records)
    while (batch := reader.next_batch()) is not None:
        yield list(batch)


def _broker_with_a_full_log(ottla_broker_factory, raw_connection):
    """A broker whose one-partition topic holds BATCHES batches."""
    broker = ottla_broker_factory()
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    producer = raw_connection(broker.bootstrap, timeout=60)
    for i in range(BATCHES):
        _, response = roundtrip(producer, ProduceRequest(transactional_id=None, acks=-1, timeout=timedelta(seconds=30),
                                topic_data=(TopicProduceData(name=TOPIC, partition_data=(
                                    PartitionProduceData(index=0, records=_batch(i)),)),)))
        assert response.responses[0].partition_responses[0].error_code == ErrorCode.none
    return broker


def _stuck_behind(broker, request) -> tuple[list[socket.socket], int]:
    """CONSUMERS connections that each pipeline five copies of `request` and never read,
    returned once the start of a response waits in every one (the broker has built them all
    and is blocked writing them); and the broker's RSS before them."""
    host, _, port = broker.bootstrap.rpartition(":")
    before = process_memory(broker.pid, "VmRSS")
    requests = b"".join(encode_request(request, correlation_id=c) for c in range(5))
    stuck = stuck_consumers(host, int(port), requests, CONSUMERS)
    try:
        wait_for(lambda: all(unread_bytes(sock) > 0 for sock in stuck), timeout=300,
                 what="the broker writing to every stuck consumer")
    except BaseException:
        for sock in stuck:
            sock.close()
        raise
    return stuck, before


def test_consumers_that_never_read_hold_one_slice_each(ottla_broker_factory, raw_connection):
    broker = _broker_with_a_full_log(ottla_broker_factory, raw_connection)
    log_bytes = BATCHES * len(_batch(0))
    stuck, before = _stuck_behind(broker, _fetch_request())
    try:
        # Another client is still answered, and gets the whole log byte for byte.
        bystander = raw_connection(broker.bootstrap, timeout=120)
        _, versions = roundtrip(bystander, ApiVersionsRequest(client_software_name="t", client_software_version="1"))
        assert versions.error_code == ErrorCode.none
        bystander.sendall(encode_request(_fetch_request(), correlation_id=7))
        fetched = _records(read_frame(bystander))
        assert len(fetched) == log_bytes
        values = [record.value for batch in _batches(fetched) for record in batch]
        assert values == [bytes([i % 256, r % 256]) * 500 for i in range(BATCHES) for r in range(100)]

        grown = process_memory(broker.pid, "VmHWM") - before
        bound = CONSUMERS * PER_CONNECTION_BOUND
        assert grown < bound, (f"{CONSUMERS} unread responses of {log_bytes >> 20} MiB took {grown >> 20} MiB "
                               f"(bound {bound >> 20} MiB)")

        # A stuck consumer that starts reading gets its five responses whole and exact.
        late = stuck[0]
        late.settimeout(120)
        for _ in range(5):
            assert _records(read_frame(late)) == fetched
    finally:
        for sock in stuck:
            sock.close()
    assert broker.running()


def _old_fetch_request():
    """Fetch v3 (message format v1: the broker down-converts the v2 batches) for all of TOPIC."""
    request = request_schema(1, 3)
    topic = request.__dataclass_fields__["topics"].type.__args__[0]
    partition = topic.__dataclass_fields__["partitions"].type.__args__[0]
    return request(replica_id=-1, max_wait=timedelta(0), min_bytes=0, max_bytes=2**31 - 1, topics=(
        topic(topic=TOPIC, partitions=(partition(partition=0, fetch_offset=0, partition_max_bytes=2**31 - 1),)),))


def test_old_format_consumers_that_never_read_hold_one_group_each(ottla_broker_factory, raw_connection):
    """Fetch v3 (message format v1): the broker converts the v2 batches it sends. Converted
    whole in the handler, each unread response held all of it (50 consumers of an 8 MB log:
    48 -> 465 MiB); converted a group of batches at a time as the socket drains, one group
    (records/legacy.GROUP_BYTES, or one batch's messages if larger) and the transport's
    buffer, within the same bound as a Fetch v4+ response. A consumer that reads gets the
    same bytes as a conversion of the whole response at once."""
    broker = _broker_with_a_full_log(ottla_broker_factory, raw_connection)
    reference = raw_connection(broker.bootstrap, timeout=120)
    reference.sendall(encode_request(_fetch_request(), correlation_id=1))
    expected = down_convert(_records(read_frame(reference)), magic=1)  # the whole log, converted at once
    stuck, before = _stuck_behind(broker, _old_fetch_request())
    try:
        grown = process_memory(broker.pid, "VmHWM") - before
        bound = CONSUMERS * PER_CONNECTION_BOUND
        print(f"{CONSUMERS} unread Fetch v3 responses: broker RSS {before >> 20} MiB + {grown >> 20} MiB at the peak")
        assert grown < bound, (f"{CONSUMERS} unread Fetch v3 responses of {len(expected) >> 20} MiB took "
                               f"{grown >> 20} MiB (bound {bound >> 20} MiB)")

        # An old client that reads gets every record, and a stuck consumer that starts reading
        # gets its five responses byte for byte as converted at once.
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, api_version=(0, 10, 1), auto_offset_reset="earliest",
                                 enable_auto_commit=False, consumer_timeout_ms=30000)
        consumer.assign([TopicPartition(TOPIC, 0)])
        values = [message.value for _, message in zip(range(BATCHES * 100), consumer)]
        consumer.close()
        assert values == [bytes([i % 256, r % 256]) * 500 for i in range(BATCHES) for r in range(100)]
        late = stuck[0]
        late.settimeout(120)
        for c in range(5):
            correlation_id, response = decode_response(read_frame(late), 1, 3)
            partition = response.responses[0].partitions[0]
            assert (correlation_id, partition.error_code) == (c, ErrorCode.none)
            assert partition.records == expected
    finally:
        for sock in stuck:
            sock.close()
    assert broker.running()


def _send_queue(local_port: int, remote_port: int) -> int | None:
    """Bytes the socket from `local_port` to `remote_port` holds unacknowledged in the kernel
    (tx_queue of /proc/net/tcp: the broker's side of a connection, seen from here)."""
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            local, remote, queues = fields[1], fields[2], fields[4]
            if int(local.split(":")[1], 16) == local_port and int(remote.split(":")[1], 16) == remote_port:
                return int(queues.split(":")[0], 16)
    return None


def test_an_unread_response_pins_at_most_the_socket_send_buffer_in_the_kernel(ottla_broker_factory, raw_connection):
    """Kafka's socket.send.buffer.bytes (100 KiB) on every connection: left to Linux's
    autotuning the send buffer of a consumer that does not read grew to 4 MiB, and the event
    loop copied that much into the kernel for each such consumer before pausing (200 of them
    held every other client for 6 s, docs/performance.md)."""
    broker = _broker_with_a_full_log(ottla_broker_factory, raw_connection)
    host, _, port = broker.bootstrap.rpartition(":")
    stuck, = stuck_consumers(host, int(port), encode_request(_fetch_request(), correlation_id=1), 1)
    try:
        wait_for(lambda: unread_bytes(stuck) > 0, timeout=120, what="the response's first bytes")
        readings = [-1]

        def settled():  # the same send queue twice in a row: the broker stopped writing
            readings.append(_send_queue(int(port), stuck.getsockname()[1]))
            return readings[-1] is not None and readings[-1] == readings[-2]
        wait_for(settled, timeout=120, interval=0.5, what="the broker's send queue to settle")
        # 100 KiB asked, which Linux doubles for its bookkeeping; the response is 4 MB.
        assert readings[-1] <= 2 * 102400, f"the kernel holds {readings[-1]} bytes of the unread response"
    finally:
        stuck.close()
