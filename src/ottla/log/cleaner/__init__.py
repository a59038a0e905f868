"""Log compaction (Kafka's log cleaner): `filter` decides what a clean keeps of each batch,
`clean` runs one pass over one log on a cleaner thread, `swap` puts the result in place
crash-safely, `service` runs the threads and chooses what to clean.

Nothing is imported here: `log.py` needs `swap` while `service` needs the log manager.
"""
