"""All partition logs of one data directory, the topic catalog, checkpoints and recovery.

Layout of `<data-dir>`:
    <topic>-<partition>/                 one Log each
    .topics/<topic id>.json              name, topic id, partition count, config overrides,
                                         the partitions not hosted here ("absent": in a
                                         cluster a broker holds only its replicas) (named
                                         by id: a 249-character topic name plus a suffix
                                         would pass the 255-byte file name limit)
    recovery-point-offset-checkpoint     Kafka's text format, one line per partition
    log-start-offset-checkpoint          same format
    replication-offset-checkpoint        same format: each partition's high watermark
    .kafka_cleanshutdown                 present only between a clean shutdown and the next start

Metadata files are written atomically (temp file, fsync, rename, fsync of the directory) and
are the commit point of topic creation and deletion: partition directories without a topic
file are leftovers of an interrupted create or delete and are removed at startup.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

from ..config import BrokerConfig, TopicConfig
from ..errors import ConfigError, DataDirError, ErrorCode, KafkaError
from .disk_worker import DiskWorker
from .log import DELETE_SUFFIX, Log
from .page_cache import RecentAppends
from ..durability import fsync

__all__ = ["LogManager", "TopicInfo", "validate_topic_name"]

log = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_FILE = "log-start-offset-checkpoint"
HIGH_WATERMARK_FILE = "replication-offset-checkpoint"
TOPICS_DIR = ".topics"
MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_PARTITION_DIR = re.compile(r"(.+)-(\d+)")


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


class TopicInfo(NamedTuple):
    name: str
    topic_id: uuid.UUID
    partitions: int  # the topic's size; the partitions stored here are `hosted`
    config: TopicConfig
    absent: frozenset[int] = frozenset()

    @property
    def hosted(self) -> list[int]:
        return [p for p in range(self.partitions) if p not in self.absent]


def validate_topic_name(name: str) -> None:
    """Kafka's Topic.validate: legal characters, length, not "." or ".."."""
    if not name:
        raise KafkaError(ErrorCode.invalid_topic_exception, "topic name is empty")
    if name in (".", ".."):
        raise KafkaError(ErrorCode.invalid_topic_exception, f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise KafkaError(
            ErrorCode.invalid_topic_exception,
            f"topic name is longer than {MAX_TOPIC_NAME_LENGTH} characters",
        )
    if not _LEGAL_TOPIC_NAME.fullmatch(name):
        raise KafkaError(
            ErrorCode.invalid_topic_exception,
            f"topic name {name!r} has characters other than ASCII alphanumerics, '.', '_' and '-'",
        )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        fsync(fd, path)
    finally:
        os.close(fd)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        fsync(f.fileno(), tmp)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def write_offset_checkpoint(path: Path, offsets: Mapping[tuple[str, int], int]) -> None:
    """Kafka's OffsetCheckpointFile: version line, count line, then `topic partition offset`."""
    lines = ["0", str(len(offsets))]
    lines += [f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(offsets.items())]
    _write_atomically(path, "\n".join(lines) + "\n")


def read_offset_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """Parse a checkpoint; a missing or malformed file reads as empty (recovery then scans)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        if lines[0].strip() != "0" or int(lines[1]) != len(lines) - 2:
            raise ValueError("bad header")
        result = {}
        for line in lines[2:]:
            topic, partition, offset = line.split()
            result[(topic, int(partition))] = int(offset)
        return result
    except FileNotFoundError:
        return {}
    except (ValueError, IndexError) as exc:
        log.warning("ignoring malformed checkpoint %s: %s", path, exc)
        return {}


class LogManager:
    """Owns every Log under `data_dir` and the durable topic catalog."""

    def __init__(
        self, data_dir: Path | str, broker_config: BrokerConfig, *, clock: Callable[[], int] = _wall_clock_ms,
        disk_worker: DiskWorker | None = None,
    ):
        self.data_dir = Path(data_dir)
        self.broker_config = broker_config
        self.topics: dict[str, TopicInfo] = {}
        self.logs: dict[tuple[str, int], Log] = {}
        self._clock = clock
        # Without one (tools, unit tests) the slow disk work is done inline, as it comes.
        self.disk_worker = disk_worker
        recent_appends = RecentAppends(broker_config["log.page.cache.max.bytes"])
        self.recent_appends = recent_appends if recent_appends.enabled else None
        self._last_checkpoint_ms = self._last_expiry_check_ms = self._last_retention_check_ms = clock()
        self._duty_errors: dict[tuple[str, tuple[str, int]], str] = {}  # logged once until they change
        self._last_hw_checkpoint_ms = self._last_checkpoint_ms
        # What each checkpoint file was last given (at load: what it held), and the write that
        # takes a deleted partition out of them, which a partition of the same name waits for.
        self._checkpointed: dict[str, dict[tuple[str, int], int]] = {}
        self._forgetting: dict[tuple[str, int], Future] = {}
        # Called on the owner's thread with the keys of deleted partitions (the log cleaner).
        self.deletion_listeners: list[Callable[[list[tuple[str, int]]], None]] = []
        (self.data_dir / TOPICS_DIR).mkdir(parents=True, exist_ok=True)
        self._load()

    # -- startup -------------------------------------------------------------------------

    def _load(self) -> None:
        marker = self.data_dir / CLEAN_SHUTDOWN_FILE
        clean = marker.exists()
        recovery_points = read_offset_checkpoint(self.data_dir / RECOVERY_POINT_FILE)
        start_offsets = read_offset_checkpoint(self.data_dir / LOG_START_OFFSET_FILE)
        high_watermarks = read_offset_checkpoint(self.data_dir / HIGH_WATERMARK_FILE)
        self._checkpointed = {RECOVERY_POINT_FILE: recovery_points, LOG_START_OFFSET_FILE: start_offsets,
                              HIGH_WATERMARK_FILE: high_watermarks}
        for entry in os.scandir(self.data_dir / TOPICS_DIR):
            if entry.name.endswith(".json"):
                info = self._read_topic_file(Path(entry.path))
                self.topics[info.name] = info
            elif entry.name.endswith(".tmp"):
                os.unlink(entry.path)
        for entry in os.scandir(self.data_dir):
            if entry.name.endswith(DELETE_SUFFIX) and entry.is_dir():  # its topic's deletion was committed
                shutil.rmtree(entry.path, ignore_errors=True)
                continue
            match = _PARTITION_DIR.fullmatch(entry.name)
            if not entry.is_dir() or match is None:
                continue
            topic, partition = match.group(1), int(match.group(2))
            info = self.topics.get(topic)
            if info is None or partition >= info.partitions or partition in info.absent:
                log.warning("removing %s: it belongs to no topic (interrupted create or delete)", entry.path)
                shutil.rmtree(entry.path)
        for info in self.topics.values():
            for partition in info.hosted:
                key = (info.name, partition)
                self.logs[key] = Log(
                    self._partition_dir(info.name, partition),
                    info.config,
                    recovery_point=recovery_points.get(key),
                    log_start_offset=start_offsets.get(key, 0),
                    clean_shutdown=clean,
                    now_ms=self._clock(),
                    recent_appends=self.recent_appends,
                    disk_worker=self.disk_worker,
                )
                self.logs[key].update_high_watermark(high_watermarks.get(key, 0))
        if clean:
            # From here on a crash must be noticed: the marker's removal has to be durable.
            marker.unlink()
            _fsync_dir(self.data_dir)

    def _read_topic_file(self, path: Path) -> TopicInfo:
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
            info = TopicInfo(meta["name"], uuid.UUID(meta["topic_id"]), int(meta["partitions"]),
                             TopicConfig(self.broker_config, meta["configs"]),
                             frozenset(int(p) for p in meta.get("absent", ())))
            validate_topic_name(info.name)
            if info.partitions < 1 or not info.hosted:
                raise ValueError(f"partition count {info.partitions}, absent {sorted(info.absent)}")
        except (ValueError, KeyError, TypeError, AttributeError, ConfigError, KafkaError) as exc:
            raise DataDirError(f"topic file {path} is corrupt ({type(exc).__name__}: {exc}); restore it from a "
                               f"backup, or remove it and the topic's partition directories") from None
        return info

    def _partition_dir(self, topic: str, partition: int) -> Path:
        return self.data_dir / f"{topic}-{partition}"

    def _topic_file(self, info: TopicInfo) -> Path:
        return self.data_dir / TOPICS_DIR / f"{info.topic_id}.json"

    def _write_topic(self, info: TopicInfo) -> None:
        meta = {
            "name": info.name,
            "topic_id": str(info.topic_id),
            "partitions": info.partitions,
            "configs": info.config.overrides,
        }
        if info.absent:
            meta["absent"] = sorted(info.absent)
        _write_atomically(self._topic_file(info), json.dumps(meta, sort_keys=True))

    # -- catalog -------------------------------------------------------------------------

    def _new_log(self, topic: str, partition: int, config: TopicConfig) -> Log:
        forgetting = self._forgetting.pop((topic, partition), None)
        if forgetting is not None:  # a partition of this name was deleted moments ago
            forgetting.result()
        return Log(
            self._partition_dir(topic, partition), config, now_ms=self._clock(), recent_appends=self.recent_appends,
            disk_worker=self.disk_worker,
        )

    def _new_logs(self, topic: str, partitions: list[int], config: TopicConfig) -> dict[tuple[str, int], Log]:
        """All of them or none: a failure part-way (no space, no descriptors left) removes the
        partitions made so far and is KAFKA_STORAGE_ERROR, so no half-created topic is left."""
        made: dict[tuple[str, int], Log] = {}
        try:
            for partition in partitions:
                made[(topic, partition)] = self._new_log(topic, partition, config)
        except OSError as exc:
            for partition_log in made.values():
                partition_log.delete()
            shutil.rmtree(self._partition_dir(topic, partition), ignore_errors=True)
            log.warning("creating %d partitions of %s failed at partition %d: %s; nothing was kept",
                        len(partitions), topic, partition, exc)
            raise KafkaError(ErrorCode.kafka_storage_error,
                             f"cannot create partition {topic}-{partition}: {exc.strerror or exc}") from None
        return made

    def _topic_config(self, configs: Mapping[str, Any] | None) -> TopicConfig:
        try:
            return TopicConfig(self.broker_config, configs)
        except ConfigError as exc:
            raise KafkaError(ErrorCode.invalid_config, str(exc)) from None

    def _topic(self, name: str) -> TopicInfo:
        info = self.topics.get(name)
        if info is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"unknown topic {name!r}")
        return info

    def create_topic(
        self,
        name: str,
        partitions: int,
        configs: Mapping[str, Any] | None = None,
        *,
        topic_id: uuid.UUID | None = None,
        validate_only: bool = False,
        absent: frozenset[int] = frozenset(),
    ) -> TopicInfo:
        """Create the partition directories, then commit the topic file. `absent`: partitions
        of the topic this data dir does not hold (a cluster broker's non-replicas).

        Raises INVALID_TOPIC_EXCEPTION (bad name, or a '.'/'_' collision as Kafka reports it),
        TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS, INVALID_CONFIG.
        """
        validate_topic_name(name)
        if name in self.topics:
            raise KafkaError(ErrorCode.topic_already_exists, f"topic {name!r} already exists")
        collision_key = name.replace(".", "_")
        for existing in self.topics:
            if existing.replace(".", "_") == collision_key:
                raise KafkaError(
                    ErrorCode.invalid_topic_exception,
                    f"topic {name!r} collides with existing topic {existing!r} "
                    "('.' and '_' are interchangeable in metric names)",
                )
        if partitions < 1:
            raise KafkaError(ErrorCode.invalid_partitions, "number of partitions must be at least 1")
        config = self._topic_config(configs)
        info = TopicInfo(name, topic_id or uuid.uuid4(), partitions, config, frozenset(absent))
        if validate_only:
            return info
        self.add_created_topic(info, self.write_topic_files(info))
        return info

    def write_topic_files(self, info: TopicInfo) -> dict[tuple[str, int], Log]:
        """The disk half of `create_topic` (directories, segments, the topic file: for 1,000
        partitions seconds of fsyncs on a busy disk): touches nothing shared, so a cluster
        broker runs it in a worker thread and then `add_created_topic` on its event loop."""
        new_logs = self._new_logs(info.name, info.hosted, info.config)
        try:
            _fsync_dir(self.data_dir)
            self._write_topic(info)  # the commit point
        except OSError as exc:
            self._discard(new_logs)
            raise KafkaError(ErrorCode.kafka_storage_error, f"cannot create topic {info.name}: {exc}") from None
        return new_logs

    def add_created_topic(self, info: TopicInfo, new_logs: dict[tuple[str, int], Log]) -> None:
        self.topics[info.name] = info
        self.logs.update(new_logs)

    def delete_topic(self, name: str) -> None:
        """Remove the topic file first (the commit point), then its partitions' data."""
        info = self._topic(name)
        self._topic_file(info).unlink()
        _fsync_dir(self.data_dir / TOPICS_DIR)
        del self.topics[name]
        self._delete_logs([(name, partition) for partition in info.hosted])

    def delete_partitions(self, name: str, partitions: set[int]) -> None:
        """Stop holding partitions (replicas moved away): the topic file records them absent
        (the commit point, one write for all), then their data goes. The last ones held take
        the topic with them."""
        info = self.topics.get(name)
        gone = sorted(p for p in partitions if info is not None and p in info.hosted)
        if not gone:
            return
        if len(gone) == len(info.hosted):
            self.delete_topic(name)
            return
        updated = info._replace(absent=info.absent | set(gone))
        self._write_topic(updated)
        self.topics[name] = updated
        self._delete_logs([(name, partition) for partition in gone])

    def _delete_logs(self, keys: list[tuple[str, int]]) -> None:
        """Each log's directory renamed away at once, then all removed in one disk-worker job
        that starts once the loop is done with them (1,000 jobs started one by one competed
        with the renames for the interpreter)."""
        directories = [self.logs.pop(key).delete(remove=False) for key in keys]
        self._forget(keys)
        for listener in self.deletion_listeners:
            listener(keys)
        if self.disk_worker is not None and directories:
            def remove() -> None:
                for directory in directories:
                    shutil.rmtree(directory, ignore_errors=True)
            self.disk_worker.submit(f"removal of {len(directories)} deleted partitions", remove)

    def host_partitions(self, name: str, partitions: set[int]) -> None:
        """Hold `partitions` of a known topic again (a replica moved back here), empty."""
        info = self._topic(name)
        missing = sorted(p for p in partitions if p in info.absent)
        if not missing:
            return
        self.logs.update(self._new_logs(name, missing, info.config))
        _fsync_dir(self.data_dir)
        updated = info._replace(absent=info.absent - set(missing))
        self._write_topic(updated)
        self.topics[name] = updated

    def add_partitions(self, name: str, total: int, *, validate_only: bool = False,
                       absent: frozenset[int] = frozenset()) -> TopicInfo:
        """Grow a topic to `total` partitions (of them, `absent` not held here); shrinking is
        INVALID_PARTITIONS, as in Kafka."""
        info = self._topic(name)
        if total <= info.partitions:
            raise KafkaError(
                ErrorCode.invalid_partitions,
                f"topic {name!r} has {info.partitions} partitions; the new count must be larger, got {total}",
            )
        updated = info._replace(partitions=total, absent=info.absent | {p for p in absent if p >= info.partitions})
        if validate_only:
            return updated
        self.add_created_partitions(updated, self.write_partition_dirs(info, updated))
        return updated

    def write_partition_dirs(self, before: TopicInfo, after: TopicInfo) -> dict[tuple[str, int], Log]:
        """The slow half of `add_partitions` (a directory and segment per new partition, for
        10,000 partitions seconds): touches nothing shared, so a broker runs it in a worker
        thread and then `add_created_partitions` on its event loop."""
        new_logs = self._new_logs(after.name, [p for p in range(before.partitions, after.partitions)
                                               if p not in after.absent], before.config)
        try:
            _fsync_dir(self.data_dir)
        except OSError as exc:
            self._discard(new_logs)
            raise KafkaError(ErrorCode.kafka_storage_error, f"cannot add partitions to {after.name}: {exc}") from None
        return new_logs

    @staticmethod
    def _discard(new_logs: dict[tuple[str, int], Log]) -> None:
        for partition_log in new_logs.values():
            partition_log.delete()

    def add_created_partitions(self, updated: TopicInfo, new_logs: dict[tuple[str, int], Log]) -> None:
        """Commit the grown topic (the topic file, with the config as it is now: an AlterConfigs
        may have passed while the directories were made) and hold its new logs; a topic deleted
        meanwhile takes them with it (UNKNOWN_TOPIC_OR_PARTITION)."""
        current = self.topics.get(updated.name)
        if current is None or current.topic_id != updated.topic_id:
            self._discard(new_logs)
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"topic {updated.name!r} was deleted")
        updated = updated._replace(config=current.config)
        for partition_log in new_logs.values():
            partition_log.config = updated.config
        try:
            self._write_topic(updated)  # the commit point
        except OSError as exc:
            self._discard(new_logs)
            raise KafkaError(ErrorCode.kafka_storage_error, f"cannot add partitions to {updated.name}: {exc}") from None
        self.topics[updated.name] = updated
        self.logs.update(new_logs)

    def alter_configs(self, name: str, overrides: Mapping[str, Any], *, validate_only: bool = False) -> TopicInfo:
        """Replace the topic's config overrides (the full set, as AlterConfigs defines it)."""
        info = self._topic(name)
        config = self._topic_config(overrides)
        if validate_only:
            return info._replace(config=config)
        updated = info._replace(config=config)
        self._write_topic(updated)
        self.topics[name] = updated
        for partition in info.hosted:
            self.logs[(name, partition)].config = config
        return updated

    def refresh_configs(self) -> None:
        """The broker's defaults changed (dynamic broker configs): every log resolves its
        settings again, from its next append on."""
        for log_ in self.logs.values():
            log_.config = log_.config

    def get_log(self, topic: str, partition: int) -> Log:
        log_ = self.logs.get((topic, partition))
        if log_ is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"unknown partition {topic}-{partition}")
        return log_

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        for info in self.topics.values():
            if info.topic_id == topic_id:
                return info
        return None

    # -- durability ----------------------------------------------------------------------

    def checkpoint(self, *, inline: bool = False) -> None:
        """Persist every partition's recovery point and log start offset (call periodically:
        log.flush.offset.checkpoint.interval.ms; a crash then rescans only what came after),
        and the high watermarks. The offsets are taken now; the files are written by the disk
        worker, if there is one and not `inline`."""
        self._write_checkpoint(RECOVERY_POINT_FILE, {k: v.recovery_point for k, v in self.logs.items()}, inline)
        self._write_checkpoint(LOG_START_OFFSET_FILE, {k: v.log_start_offset for k, v in self.logs.items()}, inline)
        self.checkpoint_high_watermarks(inline=inline)

    def checkpoint_high_watermarks(self, *, inline: bool = False) -> None:
        """Persist every partition's HW (replica.high.watermark.checkpoint.interval.ms): a
        restarted follower serves consumers only up to it until its leader says more."""
        self._write_checkpoint(HIGH_WATERMARK_FILE, {k: v.high_watermark for k, v in self.logs.items()}, inline)

    def _write_checkpoint(self, name: str, offsets: dict[tuple[str, int], int], inline: bool) -> Future | None:
        path = self.data_dir / name
        self._checkpointed[name] = offsets
        if inline or self.disk_worker is None:
            write_offset_checkpoint(path, offsets)
            return None
        return self.disk_worker.submit(f"checkpoint {name}", lambda: write_offset_checkpoint(path, offsets))

    def _forget(self, keys: list[tuple[str, int]]) -> None:
        """Take deleted partitions out of the checkpoint files (Kafka's asyncDelete does too):
        until the next periodic write they named them, and a partition created again under
        the same name that then crashed loaded the old one's log start offset (hiding its first
        records), recovery point (above what it had on disk) and high watermark. The files get
        what they were last given, less these partitions; a new log of one of these names waits
        for the write (`_new_log`)."""
        gone = set(keys)
        written = None
        for name, offsets in list(self._checkpointed.items()):
            if not gone.isdisjoint(offsets):
                written = self._write_checkpoint(name, {k: v for k, v in offsets.items() if k not in gone},
                                                 inline=False) or written
        if written is not None:
            self._forgetting.update(dict.fromkeys(gone, written))

    def tick(self, now_ms: int) -> None:
        """Time-driven duties, called about once a second: flush.ms, the recovery-point
        checkpoint (log.flush.offset.checkpoint.interval.ms), the HW checkpoint
        (replica.high.watermark.checkpoint.interval.ms), retention and producer id expiry.

        Each partition's duty runs on its own: one that fails is logged (once per distinct
        error) and every other partition, and the checkpoints, still get theirs."""
        if self.disk_worker is not None:
            self.disk_worker.complete()  # recovery points of rolls fsynced since the last tick
        self._each("flush", lambda log_: log_.flush_if_due(now_ms))
        if now_ms - self._last_checkpoint_ms >= self.broker_config["log.flush.offset.checkpoint.interval.ms"]:
            self.checkpoint()
            self._last_checkpoint_ms = self._last_hw_checkpoint_ms = now_ms
        elif now_ms - self._last_hw_checkpoint_ms >= self.broker_config["replica.high.watermark.checkpoint.interval.ms"]:
            self.checkpoint_high_watermarks()
            self._last_hw_checkpoint_ms = now_ms
        if now_ms - self._last_expiry_check_ms >= self.broker_config["producer.id.expiration.check.interval.ms"]:
            self._each("producer id expiry", lambda log_: log_.remove_expired_producers(now_ms))
            self._last_expiry_check_ms = now_ms
        if now_ms - self._last_retention_check_ms >= self.broker_config["log.retention.check.interval.ms"]:
            self._each("retention", lambda log_: log_.apply_retention(now_ms))
            self._last_retention_check_ms = now_ms

    def _each(self, duty: str, run: Callable[[Log], None]) -> None:
        for key, log_ in list(self.logs.items()):
            try:
                run(log_)
            except Exception as exc:
                if self._duty_errors.get((duty, key)) != str(exc):
                    self._duty_errors[(duty, key)] = str(exc)
                    log.error("%s of %s-%d failed: %s", duty, *key, exc)
            else:
                self._duty_errors.pop((duty, key), None)

    def flush_all(self) -> None:
        for log_ in self.logs.values():
            log_.flush()

    def close(self) -> None:
        """Clean shutdown: close every log, checkpoint the exact log ends, then drop the marker."""
        if self.disk_worker is not None:
            self.disk_worker.close()
        for log_ in self.logs.values():
            log_.close()
        self.checkpoint(inline=True)
        if self.recent_appends is not None:
            self.recent_appends.close()
        _write_atomically(self.data_dir / CLEAN_SHUTDOWN_FILE, "")
