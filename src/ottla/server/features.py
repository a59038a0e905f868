"""Kafka's feature flags (KIP-584) as this broker offers them: `transaction.version`.

Kafka finalizes features cluster-wide (`kafka-features.sh`, `kafka-storage.sh format
--feature`); Ottla takes the level from the broker config of the same name, so every broker
of a cluster must be given the same one. Clients read the level from ApiVersions v3+
(finalized features) and pick the transaction protocol by it: Java clients from 4.0 use
transactions version 2 (KIP-890 part 2) when it is 2. The request versions that exist only
for version 2 are advertised (and served) only then, so a broker at a lower level looks to
clients exactly like one that predates them.
"""

from __future__ import annotations

TRANSACTION_VERSION = "transaction.version"
MAX_TRANSACTION_VERSION = 2
# The request versions of transactions version 2, by API key: EndTxn v5 bumps the epoch,
# TxnOffsetCommit v5 adds the group's offsets partition to the transaction, AddPartitionsToTxn
# v5 is the partition leaders' request for that (and for Produce). Produce v12 stays: it also
# carries v13's topic ids, and below version 2 it is verified as v11 is (KIP-890 part 1).
_TV2_FIRST_VERSIONS = {24: 5, 26: 5, 28: 5}


def transaction_version(config) -> int:
    return config[TRANSACTION_VERSION]


def tv2_enabled(config) -> bool:
    return transaction_version(config) >= 2


def supported_versions(handlers, config) -> dict[int, tuple[int, int]]:
    """Each API's (min, max) version as served and advertised: the handlers' ranges, less the
    versions of transactions version 2 when the broker's level is below it."""
    versions = {key: (h.min_version, h.max_version) for key, h in handlers.items()}
    if not tv2_enabled(config):
        for key, first in _TV2_FIRST_VERSIONS.items():
            low, high = versions[key]
            versions[key] = (low, min(high, first - 1))
    return versions


def supported_features() -> list[tuple[str, int, int]]:
    """(name, min version, max version) this broker can run at."""
    return [(TRANSACTION_VERSION, 0, MAX_TRANSACTION_VERSION)]


def finalized_features(config) -> list[tuple[str, int]]:
    """(name, level) of the features in force; Kafka lists none at level 0."""
    level = transaction_version(config)
    return [(TRANSACTION_VERSION, level)] if level > 0 else []
