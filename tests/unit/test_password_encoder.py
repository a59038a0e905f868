"""Dynamic passwords at rest in Kafka's format (password_encoder.py): values a JVM encrypted
as Kafka's PasswordEncoder does decode here, what Ottla encrypts decodes only with its secret,
and the password.encoder.* configs are checked at start."""

import pytest

from ottla.config import BrokerConfig, ConfigError
from ottla.config_names import is_dynamic_password
from ottla.password_encoder import PasswordEncoder

# Written by javax.crypto on OpenJDK with Kafka's parameters (PBKDF2WithHmacSHA512, 4096
# iterations, 128-bit key, 256-byte salt) and layout, secret "jvm-encoder-secret". The
# password lengths are Java's (UTF-16 code units: the emoji counts two).
JVM_CBC = (
    "keyFactoryAlgorithm:PBKDF2WithHmacSHA512,cipherAlgorithm:AES/CBC/PKCS5Padding,keyLength:128,salt:5ZxuQvsH+89X0"
    "Zm3InZ0WiszYXtWy9q3oOO1ntOuukMVMdhGtN46H6ojO2iPyL7H0bWo+oMKUlVJtEcMW+87UbGqZm2Jmb6C4HS69BLlHr1hCObnYjrCm7d0fjLdt"
    "Ustcopdk5RAx0PnanNRry9U3yNdldPjOgeKI+sElZwCN8L7fJinJGhQJLk3pwD0Ug2z+u3lzquomtOcTiWFA2ycAQBkiV+K1vS+jipvSoohebd10"
    "2cepEZkFh0xadykqczRXjRBwRKfpl7RkBEz7E/jAqrmPMdnNE4QL+I53MmdqNBkvpF/cTfYkVSsBlOKc2+TbAlDTLAbMYKH1tJYz60fcg==,itera"
    "tions:4096,passwordLength:17,initializationVector:qNrPX5HfMxQSEqxllOnGow==,encryptedPassword:F5d/rbDVwRZkNqTEEfyd"
    "qgudKdoggKOqIFPbowmGsNI=")
JVM_GCM = (
    "keyFactoryAlgorithm:PBKDF2WithHmacSHA512,cipherAlgorithm:AES/GCM/NoPadding,keyLength:128,salt:ygEWliNmMzq1wMdrrY"
    "xLbs7XXI6WLekvDU1ZS3/qHojfmQGcoeSIP8oqJIqRA+LF7wVdLRdgBmyR912q0gny8DWIZs671rzr33ouNAiv7MTS1I9cSxO/Zk3y15vmMdipDI"
    "FVN8aYO32qo537iEEkEnd5hW1zT1whCex5ZceFshaADWHBLWgorls7aNIMna9AOt1wbMsibT0Kw88K0+umOwC/7tsgM6uxMw7zwD2VY+b34h4HshP6"
    "X6InTyUCmfFIGjPJ+d948I8BjLkS37m0tRpk/jQYbSB97LNJV2Ag1JHv6qklNX+yuabRMqez79gnGDsBZmIA6FscAIwnqgZrlw==,iterations:40"
    "96,passwordLength:14,initializationVector:Kz9+t3e32gsaE9TX,authenticationTagLength:128,encryptedPassword:Ubh5ie3LB"
    "zV0pdxw99uuxwM5FNKbCbbSZk9y7hBxCaE=")


def test_values_a_jvm_encrypted_as_kafka_does_decode_with_the_same_secret_only():
    encoder = PasswordEncoder("jvm-encoder-secret")
    assert encoder.decode(JVM_CBC) == "keystore pässword"
    assert encoder.decode(JVM_GCM) == "jaas 😀 config"  # the stored cipher is used, not the configured one
    for value in (JVM_CBC, JVM_GCM):
        with pytest.raises(ConfigError, match="Password could not be decoded"):
            PasswordEncoder("another-secret").decode(value)


@pytest.mark.parametrize("cipher,key_length", [("AES/CBC/PKCS5Padding", 128), ("AES/GCM/NoPadding", 256)])
def test_a_password_is_stored_in_kafkas_layout_with_fresh_salt_and_iv(cipher, key_length):
    encoder = PasswordEncoder("s3cret", "PBKDF2WithHmacSHA256", cipher, key_length, 1024)
    first, second = encoder.encode("pässwörd 😀"), encoder.encode("pässwörd 😀")
    fields = dict(item.split(":", 1) for item in first.split(","))
    assert {k: fields[k] for k in ("keyFactoryAlgorithm", "cipherAlgorithm", "keyLength", "iterations",
                                   "passwordLength")} == {
        "keyFactoryAlgorithm": "PBKDF2WithHmacSHA256", "cipherAlgorithm": cipher, "keyLength": str(key_length),
        "iterations": "1024", "passwordLength": "11"}
    assert {"salt", "initializationVector", "encryptedPassword"} <= set(fields) and "pässwörd" not in first
    assert first != second  # a new salt and IV each time
    # Decoding takes the parameters stored with the value, whatever the decoder is configured with.
    assert PasswordEncoder("s3cret").decode(first) == PasswordEncoder("s3cret").decode(second) == "pässwörd 😀"


def test_what_is_not_an_encoded_password_does_not_decode():
    encoder = PasswordEncoder("s3cret")
    for stored in ("clear-text-password", "", "cipherAlgorithm:AES/CBC/PKCS5Padding"):
        with pytest.raises(ConfigError, match="Password could not be decoded"):
            encoder.decode(stored)
    tampered = encoder.encode("secret").replace("passwordLength:6", "passwordLength:7")
    with pytest.raises(ConfigError, match="sanity check of length failed"):
        encoder.decode(tampered)


def test_password_encoder_configs_are_checked_at_start():
    config = BrokerConfig({"password.encoder.secret": "s"})
    assert (config["password.encoder.cipher.algorithm"], config["password.encoder.key.length"],
            config["password.encoder.iterations"], config["password.encoder.keyfactory.algorithm"]) == (
        "AES/CBC/PKCS5Padding", 128, 4096, None)  # Kafka's defaults
    assert not config.not_implemented
    for bad in ({"password.encoder.cipher.algorithm": "DES/CBC/PKCS5Padding"},
                {"password.encoder.keyfactory.algorithm": "PBKDF2WithHmacMD5"},
                {"password.encoder.key.length": "64"}, {"password.encoder.iterations": "1000"},
                {"password.encoder.old.secret": "s"}):
        with pytest.raises(ConfigError):
            BrokerConfig(bad)


def test_only_a_listeners_password_configs_are_stored_encrypted():
    for name in ("listener.name.plaintext.ssl.keystore.password", "listener.name.x.ssl.key.password",
                 "listener.name.x.ssl.truststore.certificates", "listener.name.sasl_ssl.plain.sasl.jaas.config"):
        assert is_dynamic_password(name), name
    for name in ("listener.name.x.ssl.keystore.location", "listener.name.x.plain.sasl.login.class",
                 "message.max.bytes", "ssl.keystore.password"):
        assert not is_dynamic_password(name), name
