"""Dynamic broker configs (KIP-226) on a single broker, with real admin clients: what can
change at runtime changes the running broker and survives a restart; what cannot is refused
with Kafka's INVALID_REQUEST; DescribeConfigs reports Kafka's sources and synonyms; a
listener's passwords are stored encrypted with password.encoder.secret, refused without it."""

import json

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewTopic
from confluent_kafka.error import KafkaError as CKError
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from ottla.errors import ConfigError
from ottla.protocol.build import make, nested
from tests.wire import roundtrip

INCREMENTAL_ALTER_CONFIGS, DESCRIBE_CONFIGS, BROKER = 44, 32, 4


def _admin(bootstrap):
    return AdminClient({"bootstrap.servers": bootstrap})


def _set_broker(admin, name, op=AlterConfigOpType.SET, **configs):
    resource = ConfigResource("BROKER", name, incremental_configs=[
        ConfigEntry(k.replace("_", "."), v, incremental_operation=op) for k, v in configs.items()])
    admin.incremental_alter_configs([resource])[resource].result(15)


def _alter_raw(sock, name, **configs):
    """IncrementalAlterConfigs SET on a BROKER resource, straight on the wire: neither
    confluent-kafka nor kafka-python can name the cluster default "" (both route BROKER
    resources by an integer id; Java's admin client can) or send to a broker not of that id."""
    schema = load_request_schema(INCREMENTAL_ALTER_CONFIGS, 1)
    entries = tuple(make(nested(schema, "AlterableConfig"), name=k.replace("_", "."), config_operation=0, value=v)
                    for k, v in configs.items())
    _, response = roundtrip(sock, make(schema, validate_only=False, resources=(
        make(nested(schema, "AlterConfigsResource"), resource_type=BROKER, resource_name=name, configs=entries),)))
    return response.responses[0]


def _synonyms(sock, resource_type, name):
    """{config: (value, source, [(synonym, value, source)])} straight from the wire:
    confluent-kafka keeps synonyms in a dict by name, so same-named ones collapse."""
    schema = load_request_schema(DESCRIBE_CONFIGS, 4)
    _, response = roundtrip(sock, make(schema, include_synonyms=True, include_documentation=False, resources=(
        make(nested(schema, "DescribeConfigsResource"), resource_type=resource_type, resource_name=name,
             configuration_keys=None),)))
    return {c.name: (c.value, c.config_source, [(s.name, s.value, s.source) for s in c.synonyms])
            for c in response.results[0].configs}


def _describe(admin, rtype, name):
    resource = ConfigResource(rtype, name)
    return admin.describe_configs([resource])[resource].result(15)


def _produce(bootstrap, topic, size):
    """The delivery error of one record of `size` bytes (None: delivered)."""
    errors = []
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 10_000_000, "retries": 0})
    producer.produce(topic, b"x" * size, on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(30) == 0
    return errors[0]


def test_cluster_default_and_per_broker_configs_apply_at_once_and_survive_a_restart(ottla_broker_factory,
                                                                                    raw_connection):
    broker = ottla_broker_factory({"message.max.bytes": 300_000})
    admin = _admin(broker.bootstrap)
    admin.create_topics([NewTopic("sized", 1, 1)])["sized"].result(15)
    assert _produce(broker.bootstrap, "sized", 200_000) is None

    assert _alter_raw(raw_connection(broker.bootstrap), "", message_max_bytes="100000").error_code == ErrorCode.none
    err = _produce(broker.bootstrap, "sized", 200_000)
    assert err is not None and err.code() == CKError.MSG_SIZE_TOO_LARGE
    entry = _describe(admin, "BROKER", "0")["message.max.bytes"]
    assert (entry.value, entry.source, entry.is_read_only) == ("100000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value, False)
    sock = raw_connection(broker.bootstrap)
    # Kafka's order: dynamic per broker, dynamic default, static, default.
    assert _synonyms(sock, BROKER, "0")["message.max.bytes"] == ("100000", 3, [
        ("message.max.bytes", "100000", 3), ("message.max.bytes", "300000", 4), ("message.max.bytes", "1048588", 5)])
    # The cluster default resource lists the dynamic defaults only.
    assert _synonyms(sock, BROKER, "") == {"message.max.bytes": ("100000", 3, [
        ("message.max.bytes", "100000", 3), ("message.max.bytes", "300000", 4), ("message.max.bytes", "1048588", 5)])}

    _set_broker(admin, "0", message_max_bytes="400000", log_retention_ms="3600000")
    assert _produce(broker.bootstrap, "sized", 200_000) is None
    topic = _synonyms(sock, 2, "sized")
    assert topic["max.message.bytes"] == ("400000", 2, [("message.max.bytes", "400000", 2),
                                                        ("message.max.bytes", "100000", 3),
                                                        ("message.max.bytes", "300000", 4),
                                                        ("message.max.bytes", "1048588", 5)])
    assert topic["retention.ms"] == ("3600000", 2, [("log.retention.ms", "3600000", 2),
                                                    ("log.retention.hours", "168", 5)])

    broker.restart()
    admin = _admin(broker.bootstrap)
    configs = _describe(admin, "BROKER", "0")
    assert (configs["message.max.bytes"].value, configs["log.retention.ms"].value) == ("400000", "3600000")
    assert _produce(broker.bootstrap, "sized", 200_000) is None

    _set_broker(admin, "0", AlterConfigOpType.DELETE, message_max_bytes="")
    assert _describe(admin, "BROKER", "0")["message.max.bytes"].value == "100000"  # the cluster default again
    err = _produce(broker.bootstrap, "sized", 200_000)
    assert err is not None and err.code() == CKError.MSG_SIZE_TOO_LARGE


def test_configs_that_cannot_change_at_runtime_are_refused_as_kafka_refuses_them(ottla_broker, raw_connection):
    admin = _admin(ottla_broker.bootstrap)
    resource = ConfigResource("BROKER", "0", incremental_configs=[
        ConfigEntry("log.dirs", "/elsewhere", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("num.io.threads", "4", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as refused:
        admin.incremental_alter_configs([resource])[resource].result(15)
    error = refused.value.args[0]
    assert error.code() == CKError.INVALID_REQUEST
    assert "Cannot update these configs dynamically: Set(log.dirs, num.io.threads)" in error.str()
    sock = raw_connection(ottla_broker.bootstrap)
    result = _alter_raw(sock, "", log_cleaner_threads="2")
    assert result.error_code == ErrorCode.invalid_request
    assert result.error_message.endswith("Cannot update these configs dynamically: Set(log.cleaner.threads)")
    result = _alter_raw(sock, "7", message_max_bytes="1000")
    assert (result.error_code, result.error_message) == (ErrorCode.invalid_request,
                                                         "Unexpected broker id, expected 0, but received 7")
    assert _alter_raw(sock, "0", message_max_bytes="-5").error_code == ErrorCode.invalid_request
    configs = _describe(admin, "BROKER", "0")
    assert configs["log.dirs"].is_read_only and not configs["message.max.bytes"].is_read_only
    assert configs["message.max.bytes"].source == ConfigSource.DEFAULT_CONFIG.value


def test_kafka_python_alters_and_describes_dynamic_broker_configs(ottla_broker):
    """kafka-python checks names against the configs DescribeConfigs reports as not read-only,
    and its legacy AlterConfigs path re-sends the other modified ones (the whole-set form)."""
    from kafka.admin import AlterConfigOp
    from kafka.admin import ConfigResource as KPConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=ottla_broker.bootstrap)
    try:
        assert admin.alter_configs([KPConfigResource(ConfigResourceType.BROKER, "0", configs={
            "log.cleaner.backoff.ms": "1000", "log.retention.bytes": "5", "log.cleanup.policy":
            (AlterConfigOp.APPEND, "compact")})]) == {"broker": {"0": "OK"}}
        assert admin.alter_configs([KPConfigResource(ConfigResourceType.BROKER, "0", configs={
            "log.retention.bytes": "7"})], incremental=False) == {"broker": {"0": "OK"}}
        modified = admin.describe_configs([KPConfigResource(ConfigResourceType.BROKER, "0")])["broker"]["0"]
    finally:
        admin.close()
    assert {name: (c["value"], c["config_source"]) for name, c in modified.items()} == {
        "log.cleaner.backoff.ms": ("1000", "DYNAMIC_BROKER_CONFIG"),
        "log.retention.bytes": ("7", "DYNAMIC_BROKER_CONFIG"),
        "log.cleanup.policy": ("delete,compact", "DYNAMIC_BROKER_CONFIG")}


def test_passwords_are_described_sensitive_with_null_values_and_never_logged(ottla_broker_factory, raw_connection):
    """Kafka's PASSWORD configs (ssl.keystore.password, sasl.jaas.config, a listener's own) are
    is_sensitive with a null value, synonyms too, whether set at start or at runtime; the
    per-listener form is stored and kept over a restart; the values reach no log line."""
    secrets = ("static-secret", "jaas-secret", "runtime-secret", "encoder-secret")
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required password="jaas-secret";'
    broker = ottla_broker_factory({"ssl.keystore.password": "static-secret", "sasl.jaas.config": jaas,
                                   "ssl.keystore.location": "/etc/kafka/broker.jks",
                                   "password.encoder.secret": "encoder-secret"}, log_level="info")
    admin = _admin(broker.bootstrap)
    configs = _describe(admin, "BROKER", "0")
    for name in ("ssl.keystore.password", "sasl.jaas.config", "password.encoder.secret"):
        assert (configs[name].value, configs[name].is_sensitive) == (None, True)
        assert configs[name].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert (configs["ssl.keystore.location"].value, configs["ssl.keystore.location"].is_sensitive) == (
        "/etc/kafka/broker.jks", False)

    listener = "listener.name.plaintext.ssl.keystore.password"
    resource = ConfigResource("BROKER", "0", incremental_configs=[
        ConfigEntry(listener, "runtime-secret", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(15)
    sock = raw_connection(broker.bootstrap)
    described = _synonyms(sock, BROKER, "0")
    assert described[listener] == (None, ConfigSource.DYNAMIC_BROKER_CONFIG.value, [
        (listener, None, ConfigSource.DYNAMIC_BROKER_CONFIG.value),
        ("ssl.keystore.password", None, ConfigSource.STATIC_BROKER_CONFIG.value)])
    assert described["sasl.jaas.config"] == (None, ConfigSource.STATIC_BROKER_CONFIG.value, [
        ("sasl.jaas.config", None, ConfigSource.STATIC_BROKER_CONFIG.value)])

    # Kafka's refusals: a reconfigurable SSL config only per listener, a listener's only per broker.
    result = _alter_raw(sock, "0", ssl_keystore_password="x")
    assert (result.error_code, result.error_message) == (ErrorCode.invalid_request, (
        "Invalid config value for resource ConfigResource(type=BROKER, name='0'): These security configs can be "
        "dynamically updated only per-listener using the listener prefix: Set(ssl.keystore.password)"))
    schema = load_request_schema(INCREMENTAL_ALTER_CONFIGS, 1)
    _, response = roundtrip(sock, make(schema, validate_only=False, resources=(
        make(nested(schema, "AlterConfigsResource"), resource_type=BROKER, resource_name="", configs=(
            make(nested(schema, "AlterableConfig"), name=listener, config_operation=0, value="x"),)),)))
    assert (response.responses[0].error_code, response.responses[0].error_message) == (ErrorCode.invalid_request, (
        "Invalid config value for resource ConfigResource(type=BROKER, name=''): Cannot update these configs at "
        f"default cluster level, broker id must be specified: Set({listener})"))
    sock.close()

    broker.restart()
    after = _describe(_admin(broker.bootstrap), "BROKER", "0")[listener]
    assert (after.value, after.is_sensitive, after.source) == (None, True, ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    logged = broker.read_stderr()
    assert "dynamic broker configs now" in logged and listener in logged
    assert not [secret for secret in secrets if secret in logged]


KEY_PASSWORD = "listener.name.plaintext.ssl.key.password"
JAAS = "listener.name.sasl_plaintext.plain.sasl.jaas.config"
JAAS_VALUE = 'org.apache.kafka.common.security.plain.PlainLoginModule required password="jaas-secret";'


def _set_passwords(admin, **configs):
    resource = ConfigResource("BROKER", "0", incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in configs.items()])
    admin.incremental_alter_configs([resource])[resource].result(15)


def _stored(broker):
    """This broker's dynamic configs as its `dynamic-broker-configs.json` holds them, and the file's text."""
    text = (broker.data_dir / "dynamic-broker-configs.json").read_text()
    return json.loads(text)["brokers"]["0"], text


def test_a_listener_password_is_refused_without_password_encoder_secret(ottla_broker):
    """Kafka refuses to store a password it cannot encrypt, through IncrementalAlterConfigs
    and AlterConfigs alike, and says why."""
    admin = _admin(ottla_broker.bootstrap)
    incremental = ConfigResource("BROKER", "0", incremental_configs=[
        ConfigEntry(KEY_PASSWORD, "clear-key-secret", incremental_operation=AlterConfigOpType.SET)])
    whole_set = ConfigResource("BROKER", "0", set_config={JAAS: JAAS_VALUE})
    with pytest.deprecated_call():  # confluent-kafka's AlterConfigs, which tools still send
        legacy = admin.alter_configs([whole_set])[whole_set]
    for future in (admin.incremental_alter_configs([incremental])[incremental], legacy):
        with pytest.raises(KafkaException) as refused:
            future.result(15)
        error = refused.value.args[0]
        assert error.code() == CKError.INVALID_REQUEST
        assert error.str().endswith("Invalid config value for resource ConfigResource(type=BROKER, name='0'): "
                                    "Password encoder secret not configured")
    stored = ottla_broker.data_dir / "dynamic-broker-configs.json"
    text = stored.read_text() if stored.exists() else ""
    assert "clear-key-secret" not in text and "jaas-secret" not in text
    configs = _describe(admin, "BROKER", "0")
    assert KEY_PASSWORD not in configs and JAAS not in configs


def test_a_listeners_passwords_are_stored_encrypted_and_survive_a_restart(ottla_broker_factory):
    """In the file only Kafka's encrypted form (AES/CBC/PKCS5Padding, a PBKDF2WithHmacSHA512
    key by default); changing another config keeps them; after a restart the broker has them
    again (DescribeConfigs lists them, without a value) and has logged none of them."""
    from ottla.password_encoder import PasswordEncoder

    broker = ottla_broker_factory({"password.encoder.secret": "encoder-secret-1"}, log_level="info")
    admin = _admin(broker.bootstrap)
    _set_passwords(admin, **{KEY_PASSWORD: "clear-key-secret", JAAS: JAAS_VALUE})
    stored, text = _stored(broker)
    assert "clear-key-secret" not in text and "jaas-secret" not in text
    fields = dict(item.split(":", 1) for item in stored[KEY_PASSWORD].split(","))
    assert (fields["cipherAlgorithm"], fields["keyFactoryAlgorithm"], fields["keyLength"], fields["iterations"]) == (
        "AES/CBC/PKCS5Padding", "PBKDF2WithHmacSHA512", "128", "4096")
    encoder = PasswordEncoder("encoder-secret-1")
    assert (encoder.decode(stored[KEY_PASSWORD]), encoder.decode(stored[JAAS])) == ("clear-key-secret", JAAS_VALUE)

    _set_broker(admin, "0", message_max_bytes="500000")  # read, changed and stored again
    stored, text = _stored(broker)
    assert set(stored) == {KEY_PASSWORD, JAAS, "message.max.bytes"} and "clear-key-secret" not in text
    assert encoder.decode(stored[KEY_PASSWORD]) == "clear-key-secret"

    broker.restart()
    configs = _describe(_admin(broker.bootstrap), "BROKER", "0")
    for name in (KEY_PASSWORD, JAAS):
        assert (configs[name].value, configs[name].is_sensitive, configs[name].source) == (
            None, True, ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    logged = broker.read_stderr()
    assert "could not be decoded" not in logged
    assert not [s for s in ("clear-key-secret", "jaas-secret", "encoder-secret-1") if s in logged]


def test_a_new_secret_takes_over_the_passwords_encrypted_with_the_old_one(ottla_broker_factory):
    """Kafka's rotation: started with a new password.encoder.secret and the former one as
    password.encoder.old.secret, the broker encrypts its passwords again with the new secret.
    A new secret alone does not decrypt them: the broker leaves them out and says so."""
    from ottla.password_encoder import PasswordEncoder

    broker = ottla_broker_factory({"password.encoder.secret": "first-secret"}, log_level="info")
    _set_passwords(_admin(broker.bootstrap), **{KEY_PASSWORD: "clear-key-secret"})
    before, _ = _stored(broker)

    broker.stop()
    broker.config["password.encoder.secret"] = "second-secret"
    broker.start()
    assert KEY_PASSWORD not in _describe(_admin(broker.bootstrap), "BROKER", "0")
    assert f"Dynamic password config {KEY_PASSWORD} could not be decoded" in broker.read_stderr()
    assert _stored(broker)[0] == before  # nothing lost: the old secret can still take it over

    broker.stop()
    broker.config["password.encoder.old.secret"] = "first-secret"
    broker.start()
    stored, text = _stored(broker)
    assert "clear-key-secret" not in text
    assert PasswordEncoder("second-secret").decode(stored[KEY_PASSWORD]) == "clear-key-secret"
    with pytest.raises(ConfigError):
        PasswordEncoder("first-secret").decode(stored[KEY_PASSWORD])
    entry = _describe(_admin(broker.bootstrap), "BROKER", "0")[KEY_PASSWORD]
    assert (entry.value, entry.source) == (None, ConfigSource.DYNAMIC_BROKER_CONFIG.value)

    del broker.config["password.encoder.old.secret"]  # the rotation is done: the old secret can go
    broker.restart()
    assert _stored(broker)[0] == stored
    assert KEY_PASSWORD in _describe(_admin(broker.bootstrap), "BROKER", "0")
