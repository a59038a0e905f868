"""Kafka record batches (message format v2): header parsing, patching, codecs, records, markers."""
