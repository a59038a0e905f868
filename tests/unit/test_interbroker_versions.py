"""Choosing a request version from the other broker's ApiVersions (Kafka's
`NodeApiVersions.latestUsableVersion`)."""

import pytest

from ottla.server.interbroker import UnsupportedVersion, highest_common_version


def test_the_highest_version_in_both_ranges_is_chosen():
    assert highest_common_version(27, (0, 2), {27: (0, 2)}) == 2  # two Ottla brokers
    assert highest_common_version(27, (0, 2), {27: (0, 1)}) == 1  # a Kafka 3.9 leader
    assert highest_common_version(27, (0, 2), {27: (1, 5)}) == 2  # a newer leader


def test_no_common_version_is_unsupported():
    with pytest.raises(UnsupportedVersion):
        highest_common_version(27, (0, 2), {27: (3, 4)})
    with pytest.raises(UnsupportedVersion):
        highest_common_version(27, (0, 2), {0: (0, 11)})
