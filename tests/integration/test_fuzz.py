"""A short structure-aware fuzz run against a real broker (issue 11); the long one is
`benchmarks/fuzz.py --frames 100000` (docs/performance.md)."""

from ottla.testing.fuzz import run

# What the broker may hold at its peak during a short run (docs/architecture.md, "Bounds").
PEAK_RSS_BOUND = 512 << 20


def test_fuzzed_requests_never_kill_the_broker_or_leave_a_connection_silent():
    report = run(1500, seed=11, workers=4, timeout_s=60.0)
    assert not report.broker_died
    assert report.silent == [], f"no answer and no close after: {report.silent[:3]}"
    assert report.frames == 1500 and report.answered + report.closed == 1500
    assert report.answered > 100 and report.closed > 100  # both paths were exercised
    assert report.bystander_sent > 0 and report.bystander_exact
    assert 0 < report.peak_rss_bytes < PEAK_RSS_BOUND
    assert not report.handler_failures, report.handler_failures  # bad input never reaches a handler as a crash
    assert report.worst_lag_ms is not None
    assert report.restarted_cleanly
    # Damaged batches inside valid Produce requests: each refused with Kafka's code, connection kept.
    assert sum(count for kind, count in report.kinds.items() if kind.startswith("batch:")) > 50
    assert report.wrong_batch_answers == [], report.wrong_batch_answers[:3]
