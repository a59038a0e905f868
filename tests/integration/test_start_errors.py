"""A data dir the broker cannot serve as it is stops `ottla serve` with one clear line and exit
status 1 -- not a Python traceback (issue 11)."""

from __future__ import annotations

import pytest

from ottla.testing.broker import BrokerProcess


def failed_start(handle: BrokerProcess) -> str:
    with pytest.raises(RuntimeError) as excinfo:
        handle.start(timeout=60)
    assert handle.process.returncode == 1
    stderr = handle.read_stderr()
    assert "Traceback" not in stderr
    return str(excinfo.value)


def test_a_corrupt_topic_file_is_one_line_and_exit_1(tmp_path):
    handle = BrokerProcess(tmp_path / "data")
    handle.start()
    assert handle.stop() == 0
    (topic_file,) = [p for p in (tmp_path / "data" / ".topics").iterdir()
                     if '"__consumer_offsets"' in p.read_text()]
    topic_file.write_text('{"name": "__consumer_offsets", "partit')  # torn by hand or by a bad disk
    message = failed_start(handle)
    (line,) = [line for line in message.splitlines() if "is corrupt (" in line]
    assert line.startswith("ottla serve: topic file ") and topic_file.name in line


def test_a_partition_count_mismatch_is_one_line_and_exit_1(tmp_path):
    handle = BrokerProcess(tmp_path / "data", {"transaction.state.log.num.partitions": 3})
    handle.start()
    assert handle.stop() == 0
    handle.config = {"transaction.state.log.num.partitions": 5}
    message = failed_start(handle)
    (line,) = [line for line in message.splitlines() if "__transaction_state has 3 partitions" in line]
    assert line.startswith("ottla serve: ") and "transaction.state.log.num.partitions=3" in line
