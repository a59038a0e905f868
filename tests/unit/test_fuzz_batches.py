"""The fuzzer's hostile batches (ottla.testing.fuzz_batches) are all ones Kafka refuses, and
the log refuses each with CORRUPT_MESSAGE or INVALID_RECORD: the fuzz test can then demand
exactly that answer from the broker (MESSAGE_TOO_LARGE too for a batch declaring more bytes
than max.message.bytes)."""

import random
import time
from collections import Counter

import pytest

from ottla.errors import KafkaError
from ottla.log import Log
from ottla.testing import fuzz_batches
from tests.unit.test_log import config


def test_every_mutation_of_every_batch_is_refused_with_kafkas_codes(tmp_path):
    log = Log(tmp_path / "t-0", config())
    rng = random.Random(7)
    seen = Counter()
    for batch in fuzz_batches.valid_batches():
        log.append(batch, now_ms=int(time.time() * 1000))  # the originals are fine
        for _ in range(150):
            kind, damaged = fuzz_batches.mutate(batch, rng)
            seen[kind] += 1
            with pytest.raises(KafkaError) as refused:
                log.append(damaged, now_ms=int(time.time() * 1000))
            assert refused.value.code in fuzz_batches.refused(kind), (kind, damaged.hex(), refused.value)
    assert set(seen) == set(fuzz_batches.MUTATIONS)
    assert log.log_end_offset == 5 + 1 + 5 + 5  # the originals' records only: nothing damaged got in
