"""Replication policy as pure state machines (no sockets, explicit time): the leader's view of
its followers, ISR and high watermark (`leader`), and the follower's truncation and fetch
state (`follower`). The replica manager's `Partition` drives them."""
