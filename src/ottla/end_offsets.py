"""ListOffsets through confluent-kafka's AdminClient, retried while a new leader cannot answer yet.

A leader elected before its high watermark reached the start of its epoch answers latest (and
a timestamp lookup past its HW) with OFFSET_NOT_AVAILABLE (v5+) or LEADER_NOT_AVAILABLE
(KIP-207): its HW would be older than what the previous leader answered. librdkafka (2.16)
hands both errors to the caller at once; kafka-python's consumer retries them itself until its
timeout. Our callers (the Spark source's planning, `ottla` commands, the demo) want the
answer, which comes one follower fetch round later: this asks again for those partitions only,
with a short backoff, until `timeout_s` has passed."""

from __future__ import annotations

import time
from typing import Mapping

from confluent_kafka import KafkaError, KafkaException, TopicPartition

__all__ = ["list_offsets", "NOT_YET_AVAILABLE"]

NOT_YET_AVAILABLE = frozenset({KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.LEADER_NOT_AVAILABLE})
_FIRST_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 1.0


def list_offsets(admin, wanted: Mapping[TopicPartition, object], *, timeout_s: float,
                 absent: frozenset[int] = frozenset(), **options) -> dict[TopicPartition, object]:
    """`admin.list_offsets(wanted, **options)`, each partition's ListOffsetsResultInfo once
    answered (None for an error code in `absent`); a partition answered OFFSET_NOT_AVAILABLE /
    LEADER_NOT_AVAILABLE is asked again until `timeout_s` ends, then its KafkaException is
    raised. Other errors are raised at once."""
    deadline = time.monotonic() + timeout_s
    pending = dict(wanted)
    answers: dict[TopicPartition, object] = {}
    backoff = _FIRST_BACKOFF_S
    while True:
        remaining = max(deadline - time.monotonic(), 0.001)
        futures = admin.list_offsets(pending, request_timeout=remaining, **options)
        retry = {}
        last_error = None
        for tp, future in futures.items():
            try:
                answers[tp] = future.result()
            except KafkaException as exc:
                if exc.args[0].code() in absent:
                    answers[tp] = None
                    continue
                if exc.args[0].code() not in NOT_YET_AVAILABLE or time.monotonic() >= deadline:
                    raise
                retry[tp] = pending[tp]
                last_error = exc
        if not retry:
            return {tp: answers[tp] for tp in wanted}
        if time.monotonic() + backoff >= deadline:
            raise last_error
        time.sleep(backoff)
        backoff = min(backoff * 2, _MAX_BACKOFF_S)
        pending = retry
