"""`make demo` end to end at a small size, and the demo's verifier against outputs that are not exact."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from ottla.demo.query import INPUT_TOPIC
from ottla.demo.verify import Record, compare, expected_output

pytestmark = pytest.mark.spark


def _count(output: str, name: str) -> int:
    match = re.search(rf"^\s+{re.escape(name)}\s+([\d,]+)", output, re.MULTILINE)
    assert match, f"no {name!r} line in the demo's output:\n{output}"
    return int(match.group(1).replace(",", ""))


def _demo(*args: str) -> tuple[int, str]:
    assert shutil.which("java"), "Spark needs Java: run scripts/install-system-deps.sh"
    result = subprocess.run([sys.executable, "-m", "ottla.demo", "--events", "3000", *args], capture_output=True,
                            text=True, timeout=840)
    return result.returncode, result.stdout + result.stderr


@pytest.mark.timeout(900)
def test_demo_runs_end_to_end_and_finds_exact_output():
    code, output = _demo()
    assert code == 0, output
    assert ">>> kill -9 spark query #1" in output and ">>> kill -9 the broker" in output
    for name in ("duplicates", "missing", "aborted records that leaked", "wrong values", "unexpected records"):
        assert _count(output, name) == 0, output
    records_in = _count(output, "records in (committed payments)")
    assert _count(output, "records out (enriched, read_committed)") == records_in
    assert 2000 < records_in < 3000  # every 7th transaction of 100 payments is aborted
    assert _count(output, "aborted records in the input log") == 3000 - records_in
    assert "EXACT:" in output


@pytest.mark.timeout(900)
def test_demo_on_three_brokers_survives_the_kill_of_an_input_leader():
    """`python -m ottla.demo --brokers 3` (issue 13): replication factor 3, the leader of an input
    partition killed with kill -9 mid-run, and still every committed payment exactly once."""
    code, output = _demo("--brokers", "3")
    assert code == 0, output
    assert re.search(r">>> kill -9 broker \d+ \(pid \d+\), leader of payments-\d", output), output
    assert re.search(r"new leaders [\d.]+s after the kill", output), output
    assert "replication factor 3, min.insync.replicas=2" in output, output
    for name in ("duplicates", "missing", "aborted records that leaked", "wrong values", "unexpected records"):
        assert _count(output, name) == 0, output
    records_in = _count(output, "records in (committed payments)")
    assert _count(output, "records out (enriched, read_committed)") == records_in > 2000
    assert "EXACT:" in output


@pytest.mark.timeout(900)
def test_demo_fails_when_the_sink_is_only_at_least_once():
    """The control experiment: the query is killed after part of a micro-batch reached the output, so a
    sink without transactions writes those records again when the batch is replayed."""
    code, output = _demo("--delivery", "at_least_once")
    assert code == 1, output
    assert _count(output, "duplicates") > 0, output
    assert _count(output, "missing") == 0 and _count(output, "aborted records that leaked") == 0, output
    assert "NOT EXACT" in output
    shutil.rmtree(re.search(r"logs kept in (\S+)", output).group(1))  # kept for debugging; not needed here


def _payments(n: int) -> list[Record]:
    return [Record(i % 2, i // 2, f"acct-{i % 3:03d}".encode(),
                   json.dumps({"id": f"pay-{i}", "account": f"acct-{i % 3:03d}", "amount_cents": 100 + 997 * i,
                               "currency": "EUR"}).encode()) for i in range(n)]


def _enriched(payments: list[Record]) -> list[Record]:
    out = []
    for offset, record in enumerate(payments):
        value = expected_output(json.loads(record.value), INPUT_TOPIC, record.partition, record.offset)
        out.append(Record(0, offset, value["id"].encode(), json.dumps(value).encode()))
    return out


def test_verifier_accepts_exact_output():
    payments = _payments(10)
    report = compare(INPUT_TOPIC, payments, set(), _enriched(payments))
    assert report.exact and report.records_out == 10


def test_verifier_catches_duplicates_missing_leaked_and_wrong_records():
    payments = _payments(10)
    output = _enriched(payments)
    assert compare(INPUT_TOPIC, payments, set(), output + output[:2]).duplicates == 2
    assert compare(INPUT_TOPIC, payments, set(), output[1:]).missing == 1

    aborted = _payments(12)[10:]
    leaked = compare(INPUT_TOPIC, payments, {"pay-10", "pay-11"}, output + _enriched(aborted)[:1])
    assert leaked.leaked == 1 and not leaked.exact

    wrong = Record(0, 0, output[3].key, output[3].value.replace(b'"band": "', b'"band": "x'))
    assert compare(INPUT_TOPIC, payments, set(), output[:3] + [wrong] + output[4:]).wrong == 1
    moved = _enriched(_payments(10)[:3]) + [Record(0, 0, b"pay-3", json.dumps(
        expected_output(json.loads(payments[3].value), INPUT_TOPIC, 1, 99)).encode())] + output[4:]
    assert compare(INPUT_TOPIC, payments, set(), moved).wrong == 1  # right values, wrong source offset
    for report in (compare(INPUT_TOPIC, payments, set(), output + output[:1]),
                   compare(INPUT_TOPIC, payments, set(), output[1:])):
        assert not report.exact
