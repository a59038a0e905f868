"""Protocol classes kio 0.6 lacks, generated from Kafka 3.9's message schemas by
``scripts/generate_legacy_schemas.py``: the ZooKeeper-era controller APIs and the
versions KIP-896 removed. ``index`` maps (api key, version) to them."""
