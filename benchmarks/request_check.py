"""Cost of the request pre-check (protocol/shape.py) on Produce frames, in-process.

    .venv/bin/python benchmarks/request_check.py

For each frame size and Produce version: the pre-check alone, and the whole decode_request
(pre-check + kio's parse), in microseconds of CPU per request (process time, so a busy
shared machine disturbs it less than wall-clock time).
"""

from __future__ import annotations

import importlib
import time
import timeit
from datetime import timedelta

from ottla.protocol.codec import decode_request
from ottla.protocol.shape import check_request
from ottla.testing.fuzz import encode


def _frame(version: int, size: int, partitions: int) -> memoryview:
    schema = importlib.import_module(f"kio.schema.produce.v{version}.request")
    request = schema.ProduceRequest(transactional_id=None, acks=-1, timeout=timedelta(seconds=5), topic_data=(
        schema.TopicProduceData(name="orders", partition_data=tuple(
            schema.PartitionProduceData(index=p, records=b"x" * (size // partitions)) for p in range(partitions))),))
    # As the network layer hands it over: a read-only view of the frame's own buffer.
    return memoryview(bytearray(encode(request, 1)[4:])).toreadonly()


def main() -> None:
    print(f"{'frame':>10} {'version':>8} {'partitions':>10} {'check us':>9} {'decode us':>10}")
    for size in (1_000_000, 100_000):
        for version, partitions in ((9, 1), (3, 1), (9, 10)):
            frame = _frame(version, size, partitions)
            number = 20000
            check = min(timeit.repeat(lambda: check_request(frame, 0, version), number=number, repeat=5,
                                      timer=time.process_time)) / number
            decode = min(timeit.repeat(lambda: decode_request(frame, {0: (0, 11)}), number=number // 4,
                                       repeat=5, timer=time.process_time)) / (number // 4)
            print(f"{size:>10} {version:>8} {partitions:>10} {check * 1e6:>9.1f} {decode * 1e6:>10.1f}")


if __name__ == "__main__":
    main()
