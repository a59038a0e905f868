"""Configs that change while the broker runs: dynamic broker configs (KIP-226) and, in a
cluster, topic configs altered on any broker.

Where they live is Kafka's: in a cluster `/config/brokers/<id>`, `/config/brokers/<default>`
and `/config/topics/<t>` in the store, each change announced by a `/config/changes`
notification that every broker watches; it then re-reads the entities named by the
notifications it has not seen (its own or the default broker configs, the topics it holds
replicas of) and applies them. At start it reads them all. A single node
keeps its dynamic broker configs in `dynamic-broker-configs.json` in the data dir (Kafka's
KRaft keeps them in its metadata log), so a restart keeps them.

Group configs (KIP-848, `GROUP` resources) live in `/config/groups/<g>` in a cluster (Kafka 4
keeps them as ConfigRecords in its metadata log, so every broker answers for every group), in
`group-configs.json` on a single node. No broker acts on them (`group_config.py`).

A listener's passwords are stored encrypted with `password.encoder.secret` (KIP-226, Kafka's
format: `password_encoder.py`) and decrypted when read; without a secret they are refused, as
Kafka refuses them. At start, passwords encrypted with `password.encoder.old.secret` are
encrypted again with the new secret and written back (Kafka's secret rotation).

Applying a change: the broker's config layers are replaced (`BrokerConfig.set_dynamic`),
the controller takes unclean.leader.election.enable, every log resolves its settings again,
and the cleaner and connection limits re-read theirs.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Mapping

from ..cluster.store import NoSuchTopic, StoreError
from ..config import (ConfigError, coerce_dynamic, redacted, render, report_not_applied_listener_configs,
                      validate_topic_configs)
from ..config_names import is_dynamic_password
from ..errors import ErrorCode, KafkaError
from ..group_config import report_not_applied, validate_group_configs
from ..password_encoder import encoder_from_config
from ..producer_state._files import atomic_write
from .clock import now_ms

__all__ = ["DynamicConfigs"]

log = logging.getLogger("ottla.config")

_LOCAL_FILE = "dynamic-broker-configs.json"
_GROUPS_FILE = "group-configs.json"
_CHANGE_EXPIRATION_MS = 15 * 60 * 1000  # Kafka's ZkNodeChangeNotificationListener.changeExpirationMs
DEFAULT_ENTITY = "<default>"  # Kafka's ConfigEntityName.Default


class DynamicConfigs:
    def __init__(self, broker):
        self.broker = broker
        self.store = broker.membership.store if broker.membership is not None else None
        self._path = broker.data_dir / _LOCAL_FILE
        self._changed = asyncio.Event()
        self._reloading = asyncio.Lock()  # one reload at a time: an older read never lands last
        self._seen = -1  # the last `/config/changes` sequence number applied
        self._task: asyncio.Task | None = None
        self._groups_path = broker.data_dir / _GROUPS_FILE
        self._groups: dict[str, dict[str, str]] = {}  # a single node's group configs
        self._groups_lock = asyncio.Lock()  # one read-modify-write of the groups file at a time
        self._encoder = encoder_from_config(broker.config)
        if self.store is None:
            per_broker, default = self._read_local()
            rotated = self._reencrypted(per_broker)
            if rotated is not None:
                self._write_local(rotated, default)
                per_broker = rotated
            self._apply_broker(self._decrypted(per_broker), self._decrypted(default))
            if self._groups_path.exists():
                self._groups = json.loads(self._groups_path.read_text()).get("groups", {})
                report_not_applied({name for configs in self._groups.values() for name in configs})

    # -- where they are kept ------------------------------------------------------------------
    def _read_local(self) -> tuple[dict, dict]:
        if not self._path.exists():
            return {}, {}
        entities = json.loads(self._path.read_text()).get("brokers", {})
        return entities.get(str(self.broker.node_id), {}), entities.get(DEFAULT_ENTITY, {})

    def _write_local(self, per_broker: Mapping[str, str], default: Mapping[str, str]) -> None:
        data = {"version": 1, "brokers": {str(self.broker.node_id): dict(per_broker), DEFAULT_ENTITY: dict(default)}}
        atomic_write(self._path, json.dumps(data, sort_keys=True).encode())

    async def stored_broker_configs(self, broker_id: int | None) -> dict[str, str]:
        """The dynamic configs stored for this broker (an id) or the cluster default (None),
        passwords decrypted (IncrementalAlterConfigs changes them and stores them again)."""
        return await asyncio.to_thread(self._read_broker, broker_id)

    def _read_broker(self, broker_id: int | None) -> dict[str, str]:
        if self.store is not None:
            stored = self.store.broker_configs(broker_id)
        else:
            per_broker, default = self._read_local()
            stored = default if broker_id is None else per_broker
        return self._decrypted(stored)

    # -- passwords at rest --------------------------------------------------------------------
    def _encrypted(self, entity: str, configs: Mapping[str, str]) -> dict[str, str]:
        """`configs` as stored: passwords encrypted (Kafka's `toPersistentProps`)."""
        passwords = [name for name in configs if is_dynamic_password(name)]
        if passwords and self._encoder is None:
            raise KafkaError(ErrorCode.invalid_request, f"Invalid config value for resource ConfigResource("
                                                        f"type=BROKER, name='{entity}'): Password encoder secret "
                                                        "not configured")
        return {name: self._encoder.encode(value) if name in passwords else value for name, value in configs.items()}

    def _decrypted(self, stored: Mapping[str, str]) -> dict[str, str]:
        """Stored configs with their passwords decrypted; one that does not decrypt with this
        secret is left out with an error, as Kafka's `fromPersistentProps` does."""
        result = {}
        for name, value in stored.items():
            if is_dynamic_password(name):
                if self._encoder is None:
                    log.error("Dynamic password config %s could not be decoded, ignoring: "
                              "password.encoder.secret is not set", name)
                    continue
                try:
                    value = self._encoder.decode(value)
                except ConfigError as exc:
                    log.error("Dynamic password config %s could not be decoded, ignoring: %s", name, exc)
                    continue
            result[name] = value
        return result

    def _reencrypted(self, stored: Mapping[str, str]) -> dict[str, str] | None:
        """After a change of secret: this broker's passwords that `password.encoder.old.secret`
        decrypts, encrypted with the new secret (Kafka's `maybeReEncodePasswords`); None when
        there are none. One the old secret does not decrypt stays as it is: it was encrypted
        again at an earlier start, which the old secret outlived."""
        old = encoder_from_config(self.broker.config, "password.encoder.old.secret")
        if old is None:
            return None
        rotated = {}
        for name, value in stored.items():
            if is_dynamic_password(name):
                try:
                    rotated[name] = self._encoder.encode(old.decode(value))
                except ConfigError:
                    continue
        if not rotated:
            return None
        log.info("dynamic password configs %s encrypted again with the new password.encoder.secret",
                 ", ".join(sorted(rotated)))
        return {**stored, **rotated}

    # -- changing them ------------------------------------------------------------------------
    async def alter_broker(self, broker_id: int | None, configs: Mapping[str, str], validate_only: bool) -> None:
        """Replace the dynamic configs of this broker (its id) or of the cluster (None).
        INVALID_REQUEST for a config that cannot change at runtime or a bad value, as Kafka."""
        entity = "" if broker_id is None else str(broker_id)
        try:
            coerce_dynamic(configs, per_broker=broker_id is not None)
        except ConfigError as exc:
            raise KafkaError(ErrorCode.invalid_request, f"Invalid config value for resource ConfigResource("
                                                        f"type=BROKER, name='{entity}'): {exc}") from None
        if validate_only:
            return
        stored = await asyncio.to_thread(self._encrypted, entity, {name: str(value) for name, value in configs.items()})
        if self.store is not None:
            await asyncio.to_thread(self.store.set_broker_configs, broker_id, stored)
            await self.catch_up()  # this broker sees its own change at once; the others on the notification
            return
        per_broker, default = self._read_local()
        if broker_id is None:
            default = stored
        else:
            per_broker = stored
        await asyncio.to_thread(self._write_local, per_broker, default)
        self._apply_broker(*await asyncio.to_thread(lambda: (self._decrypted(per_broker), self._decrypted(default))))

    async def alter_topic(self, name: str, configs: Mapping[str, str], validate_only: bool) -> None:
        """A cluster topic's configs: `/config/topics/<t>` and a notification; the brokers
        holding its replicas apply them when they see it."""
        try:
            validate_topic_configs(configs)
        except ConfigError as exc:
            raise KafkaError(ErrorCode.invalid_config, str(exc)) from None
        if not self.broker.metadata.has_topic(name):
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"Topic {name} does not exist")
        if validate_only:
            return
        try:
            await asyncio.to_thread(self.store.set_topic_configs, name, {k: render(v) for k, v in configs.items()})
        except NoSuchTopic:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"Topic {name} does not exist") from None
        await self.catch_up()

    async def group_configs(self, name: str) -> dict[str, str]:
        """The configs stored for a group (none set: empty, whether or not the group exists)."""
        if self.store is not None:
            return await asyncio.to_thread(self.store.group_configs, name)
        return dict(self._groups.get(name, {}))

    async def group_config_names(self) -> list[str]:
        if self.store is not None:
            return await asyncio.to_thread(self.store.group_config_names)
        return sorted(self._groups)

    async def alter_group(self, name: str, configs: Mapping[str, str], validate_only: bool) -> None:
        """Replace a group's configs: Kafka's ControllerConfigurationValidator for GROUP (the
        whole new set checked), then stored where every broker reads them."""
        if name == "":
            raise KafkaError(ErrorCode.invalid_request, "Default group resources are not allowed.")
        nulls = sorted(key for key, value in configs.items() if value is None)
        if nulls:
            raise KafkaError(ErrorCode.invalid_config, f"Null value not supported for group configs: {','.join(nulls)}")
        try:
            validate_group_configs(configs, self.broker.config)
        except ConfigError as exc:
            raise KafkaError(ErrorCode.invalid_config, str(exc)) from None
        if validate_only:
            return
        stored = {key: str(value) for key, value in configs.items()}
        if self.store is not None:
            await asyncio.to_thread(self.store.set_group_configs, name, stored)
        else:
            async with self._groups_lock:
                groups = {**self._groups, name: stored}
                if not stored:
                    del groups[name]
                data = json.dumps({"version": 1, "groups": groups}, sort_keys=True).encode()
                await asyncio.to_thread(atomic_write, self._groups_path, data)
                self._groups = groups
        report_not_applied(stored)

    # -- applying them ------------------------------------------------------------------------
    def _apply_broker(self, per_broker: Mapping[str, str], default: Mapping[str, str]) -> None:
        layers = []
        for entity, configs in ((self.broker.node_id, per_broker), (DEFAULT_ENTITY, default)):
            try:
                layers.append(coerce_dynamic(configs, per_broker=entity != DEFAULT_ENTITY))
            except ConfigError as exc:
                # Written by another tool (or a newer broker): keep the rest of the broker going.
                log.warning("dynamic broker configs of %s not applied: %s", entity, exc)
                layers.append({})
        config = self.broker.config
        if (config.dynamic, config.dynamic_default) == tuple(layers):
            return
        config.set_dynamic(*layers)
        if self.broker.controller_service is not None:
            self.broker.controller_service.set_unclean_default(config["unclean.leader.election.enable"])
        self.broker.logs.refresh_configs()
        self.broker.cleaner.reconfigure(config)
        self.broker.connections.reconfigure(config)
        report_not_applied_listener_configs(layers[0])
        log.info("dynamic broker configs now %s, cluster defaults %s", redacted(layers[0]), redacted(layers[1]))

    async def catch_up(self) -> None:
        """Apply the changes announced since the last notification seen (Kafka's
        ZkNodeChangeNotificationListener): re-read only the entities they name."""
        async with self._reloading:
            changes = await asyncio.to_thread(self.store.config_changes, self._seen)
            if not changes:
                return
            self._seen = changes[-1][0]
            entities = {path for _, path in changes}
            if any(path.startswith("brokers/") for path in entities):
                await self._reload_broker()
            names = {path[len("topics/"):] for path in entities if path.startswith("topics/")}
            await self._reload_topics(sorted(names & set(self.broker.logs.topics)))
            await asyncio.to_thread(self.store.purge_config_changes, now_ms() - _CHANGE_EXPIRATION_MS)

    async def _reload_broker(self) -> None:
        per_broker = await asyncio.to_thread(self._read_broker, self.broker.node_id)
        default = await asyncio.to_thread(self._read_broker, None)
        self._apply_broker(per_broker, default)

    @property
    def last_change_seen(self) -> int:
        """The last `/config/changes` sequence number applied."""
        return self._seen

    async def reload_topics(self, names) -> None:
        """Re-read these topics' configs: a log created while a change to them was announced
        missed that change (only existing logs are reloaded by `catch_up`)."""
        async with self._reloading:
            await self._reload_topics(names)

    async def _reload_topics(self, names) -> None:
        logs = self.broker.logs
        for name in names:
            stored = await asyncio.to_thread(self.store.topic_configs, name)
            info = logs.topics.get(name)
            if info is None:
                continue
            try:
                wanted = validate_topic_configs(stored)
            except ConfigError as exc:
                log.warning("configs of topic %s not applied: %s", name, exc)
                continue
            if wanted != info.config.overrides:
                logs.alter_configs(name, wanted)
                log.info("topic %s configs now %s", name, wanted)

    # -- lifecycle (cluster) ------------------------------------------------------------------
    async def start(self) -> None:
        """Watch `/config/changes`, then read everything once: what changed while this broker
        was away is in the store, not necessarily in notifications it has not seen."""
        if self.store is None:
            return
        loop = asyncio.get_running_loop()
        self.store.watch("config_changes", lambda: loop.call_soon_threadsafe(self._changed.set))
        async with self._reloading:
            node_id = self.broker.node_id
            rotated = await asyncio.to_thread(lambda: self._reencrypted(self.store.broker_configs(node_id)))
            if rotated is not None:
                await asyncio.to_thread(self.store.set_broker_configs, node_id, rotated)
            changes = await asyncio.to_thread(self.store.config_changes, self._seen)
            self._seen = changes[-1][0] if changes else self._seen
            await self._reload_broker()
            await self._reload_topics(sorted(self.broker.logs.topics))
        self._task = loop.create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                await self.catch_up()
            except StoreError as exc:
                log.warning("config changes not read (%s); retrying in a second", exc)
                await asyncio.sleep(1.0)
                self._changed.set()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
