"""Option parsing, range planning and admission control, without Spark or a broker."""

from __future__ import annotations

import pytest


from ottla.spark.options import EARLIEST, LATEST, OptionError, parse_read_options, parse_write_options
from ottla.spark.source import BatchReader, OffsetRange, ReadTask, _admit, _from_json, _to_json, plan, source_schema

BOOTSTRAP = {"kafka.bootstrap.servers": "localhost:9092"}


def test_read_options_mirror_spark_kafka():
    options = parse_read_options({**BOOTSTRAP, "subscribe": "a, b", "startingOffsets": '{"a":{"0":5,"1":-2}}',
                                  "endingOffsets": '{"a":{"0":-1}}', "kafka.security.protocol": "PLAINTEXT"})
    assert options.subscription.topics == ("a", "b")
    assert options.starting == {("a", 0): 5, ("a", 1): EARLIEST}
    assert options.ending == {("a", 0): LATEST}
    assert options.read_committed and options.fail_on_data_loss and not options.include_headers
    assert options.client == {"bootstrap.servers": "localhost:9092", "security.protocol": "PLAINTEXT"}
    assigned = parse_read_options({**BOOTSTRAP, "assign": '{"a":[1,0]}', "kafka.isolation.level": "read_uncommitted"})
    assert assigned.subscription.assigned == (("a", 0), ("a", 1)) and not assigned.read_committed


@pytest.mark.parametrize("options, message", [
    ({"subscribe": "a"}, "kafka.bootstrap.servers"),
    ({**BOOTSTRAP}, "exactly one of"),
    ({**BOOTSTRAP, "subscribe": "a", "subscribePattern": "a.*"}, "exactly one of"),
    ({**BOOTSTRAP, "subscribePattern": "("}, "not a valid regular expression"),
    ({**BOOTSTRAP, "assign": "[0]"}, "must map topics"),
    ({**BOOTSTRAP, "subscribe": "a", "startingOffsets": "{"}, "not valid JSON"),
    ({**BOOTSTRAP, "subscribe": "a", "startingOffsets": '{"a":{"0":-3}}'}, "bad entry"),
    ({**BOOTSTRAP, "subscribe": "a", "endingOffsets": '{"a":{"0":-2}}'}, "bad entry"),
    ({**BOOTSTRAP, "subscribe": "a", "endingOffsets": "earliest"}, "endingOffsets"),
    ({**BOOTSTRAP, "subscribe": "a", "maxOffsetsPerTrigger": "0"}, "positive integer"),
    ({**BOOTSTRAP, "subscribe": "a", "includeHeaders": "yes"}, "'true' or 'false'"),
    ({**BOOTSTRAP, "subscribe": "a", "kafka.enable.auto.commit": "true"}, "manages them itself"),
    ({**BOOTSTRAP, "subscribe": "a", "kafka.isolation.level": "dirty"}, "kafka.isolation.level"),
    ({**BOOTSTRAP, "subscribe": "a", "startingOffset": "earliest"}, "unknown option"),
    ({**BOOTSTRAP, "subscribe": "a", "fetchOffset.numRetries": "-1"}, "non-negative integer"),
    ({**BOOTSTRAP, "subscribe": "a", "fetchOffset.retryIntervalMs": "soon"}, "non-negative integer"),
])
def test_bad_read_options(options, message):
    with pytest.raises(OptionError, match=message):
        parse_read_options(options)


def test_fetch_offset_retries_are_spark_kafka_options_of_streaming_reads():
    given = parse_read_options({**BOOTSTRAP, "subscribe": "a", "fetchOffset.numRetries": "0",
                                "fetchOffset.retryIntervalMs": "250"})
    assert (given.fetch_offset_num_retries, given.fetch_offset_retry_interval_ms) == (0, 250)
    default = parse_read_options({**BOOTSTRAP, "subscribe": "a"})
    assert (default.fetch_offset_num_retries, default.fetch_offset_retry_interval_ms) == (None, None)
    with pytest.raises(OptionError, match="streaming reads only"):
        BatchReader(given, source_schema(include_headers=False))


def test_write_options():
    assert parse_write_options({**BOOTSTRAP, "topic": "t"}, streaming=True).exactly_once
    assert not parse_write_options({**BOOTSTRAP, "topic": "t"}, streaming=False).exactly_once
    with pytest.raises(OptionError, match="applies to streaming writes"):
        parse_write_options({**BOOTSTRAP, "topic": "t", "deliveryGuarantee": "exactly_once"}, streaming=False)
    with pytest.raises(OptionError, match="markerTopic"):
        parse_write_options(BOOTSTRAP, streaming=True)
    with pytest.raises(OptionError, match="manages them itself"):
        parse_write_options({**BOOTSTRAP, "topic": "t", "kafka.transactional.id": "x"}, streaming=True)
    routed = parse_write_options({**BOOTSTRAP, "markerTopic": "m"}, streaming=True)
    assert routed.topic is None and routed.marker_topic == "m"


def _options(**extra):
    return parse_read_options({**BOOTSTRAP, "subscribe": "t", **extra})


def test_plan_skips_empty_ranges_and_reads_small_ones_in_one_task():
    starts = {("t", 0): 0, ("t", 1): 5, ("t", 2): 7}
    ends = {("t", 0): 10, ("t", 1): 5, ("t", 2): 9}
    assert plan(starts, ends, _options()) == [ReadTask((OffsetRange("t", 0, 0, 10), OffsetRange("t", 2, 7, 9)))]


def test_plan_shares_tasks_up_to_10000_offsets_in_partition_order():
    sizes = [15_000, 3_000, 4_000, 9_000, 1_000]
    tasks = plan({("t", p): 0 for p in range(5)}, {("t", p): n for p, n in enumerate(sizes)}, _options())
    assert [[r.partition for r in task.ranges] for task in tasks] == [[0], [1, 2], [3, 4]]
    assert [r.end for task in tasks for r in task.ranges] == sizes


def test_plan_splits_large_ranges():
    starts, ends = {("t", 0): 0, ("t", 1): 0}, {("t", 0): 10, ("t", 1): 2}
    split = plan(starts, ends, _options(maxRecordsPerPartition="4"))
    assert [[(r.partition, r.start, r.end) for r in task.ranges] for task in split] == [
        [(0, 0, 3)], [(0, 3, 6)], [(0, 6, 10)], [(1, 0, 2)]]
    capped = plan(starts, ends, _options(maxRecordsPerPartition="8"))  # the cap bounds shared tasks too
    assert [[(r.partition, r.start, r.end) for r in task.ranges] for task in capped] == [
        [(0, 0, 5)], [(0, 5, 10), (1, 0, 2)]]
    wide = plan(starts, ends, _options(minPartitions="6"))  # minPartitions: one range per task
    assert len(wide) >= 6 and all(len(t.ranges) == 1 for t in wide)
    assert sum(r.end - r.start for t in wide for r in t.ranges) == 12
    even = {("t", p): 0 for p in range(4)}, {("t", p): n for p, n in enumerate([94, 94, 93, 94])}
    assert len(plan(*even, _options(minPartitions="4"))) == 4  # as Spark: enough ranges, none is split
    assert len(plan(*even, _options(minPartitions="6"))) == 7  # shares rounded half up, as Spark: 2 + 2 + 1 + 2
    assert plan({("t", 0): 0}, {("t", 0): 2}, _options(minPartitions="10")) == [
        ReadTask((OffsetRange("t", 0, 0, 1),)), ReadTask((OffsetRange("t", 0, 1, 2),))]


def test_admission_spreads_the_budget_by_backlog_and_always_progresses():
    base = {("t", 0): 0, ("t", 1): 100, ("t", 2): 0}
    latest = {("t", 0): 90, ("t", 1): 110, ("t", 2): 0}
    end = _admit(base, latest, 10)
    assert sum(end[tp] - base[tp] for tp in base) == 10
    assert end == {("t", 0): 9, ("t", 1): 101, ("t", 2): 0}
    tiny = _admit({("t", p): 0 for p in range(4)}, {("t", p): 5 for p in range(4)}, 1)
    assert sum(tiny.values()) == 1
    assert _admit(base, latest, 1000) == latest


def test_offsets_json_is_canonical():
    offsets = {("b", 10): 1, ("a", 2): 3, ("b", 9): 4}
    assert list(_to_json(offsets)) == ["a", "b"] and list(_to_json(offsets)["b"]) == ["9", "10"]
    assert _from_json(_to_json(offsets)) == offsets
