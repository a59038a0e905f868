"""Wall-clock milliseconds, the unit of every Kafka timestamp and timeout."""

import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000
