"""Encryption of dynamic password configs at rest (KIP-226), in Kafka's format.

A listener's passwords set at runtime (`listener.name.<l>.ssl.key.password`, a mechanism's
`sasl.jaas.config`, ...) are stored encrypted with `password.encoder.secret`: a key derived
from the secret and a random 256-byte salt (PBKDF2, `password.encoder.keyfactory.algorithm`,
`password.encoder.iterations`, `password.encoder.key.length` bits), then AES
(`password.encoder.cipher.algorithm`: CBC with PKCS#5 padding by default, or GCM) with a
random IV. What is stored is Kafka's: a `key:value,...` map holding the base64 ciphertext,
salt and IV with the parameters used, so a value decodes with the parameters it was written
with, whatever the broker is configured with now, and a value Kafka's ZooKeeper-mode broker
wrote decodes here too.

PBKDF2 is `hashlib`'s (OpenSSL's); AES comes from PyCA's `cryptography` (OpenSSL too: the
standard library has no cipher), imported only when a password is encoded or decoded, so a
broker that stores none does not pay for the import at start.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os

from .errors import ConfigError

__all__ = ["PasswordEncoder", "encoder_from_config"]

# Java's key factory names and the hashlib digest each is.
_KEY_FACTORIES = {"PBKDF2WithHmacSHA512": "sha512", "PBKDF2WithHmacSHA256": "sha256", "PBKDF2WithHmacSHA1": "sha1"}
_CBC, _GCM = "AES/CBC/PKCS5Padding", "AES/GCM/NoPadding"
CIPHERS = (_CBC, _GCM)
KEY_FACTORY_ALGORITHMS = tuple(_KEY_FACTORIES)
_SALT_BYTES = 256  # Kafka's
_GCM_IV_BYTES, _GCM_TAG_BITS = 12, 128  # the JDK's defaults for a GCM cipher given no parameters


class PasswordEncoder:
    """Encodes with the configured parameters; decodes with those stored beside the value."""

    def __init__(self, secret: str, key_factory_algorithm: str | None = None, cipher_algorithm: str = _CBC,
                 key_length: int = 128, iterations: int = 4096):
        _check(key_factory_algorithm or "PBKDF2WithHmacSHA512", cipher_algorithm, key_length)
        self._secret = secret.encode()  # Java's PBEKeySpec takes the secret's chars as UTF-8
        self._key_factory = key_factory_algorithm or "PBKDF2WithHmacSHA512"
        self._cipher = cipher_algorithm
        self._key_length = key_length
        self._iterations = iterations

    def encode(self, password: str) -> str:
        salt = os.urandom(_SALT_BYTES)
        key = self._key(self._key_factory, self._key_length, salt, self._iterations)
        fields = {"keyFactoryAlgorithm": self._key_factory, "cipherAlgorithm": self._cipher,
                  "keyLength": str(self._key_length), "salt": _b64(salt), "iterations": str(self._iterations),
                  # Java's String.length(): UTF-16 code units, for Kafka's length check on decode
                  "passwordLength": str(len(password.encode("utf-16-le")) // 2)}
        plain = password.encode()
        if self._cipher == _GCM:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            iv = os.urandom(_GCM_IV_BYTES)
            encrypted = AESGCM(key).encrypt(iv, plain, None)  # ciphertext then tag, as Java's doFinal
            fields["authenticationTagLength"] = str(_GCM_TAG_BITS)
        else:
            from cryptography.hazmat.primitives import padding
            from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

            iv = os.urandom(16)
            padder = padding.PKCS7(128).padder()
            encryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
            encrypted = encryptor.update(padder.update(plain) + padder.finalize()) + encryptor.finalize()
        fields["initializationVector"] = _b64(iv)
        fields["encryptedPassword"] = _b64(encrypted)
        return ",".join(f"{name}:{value}" for name, value in fields.items())

    def decode(self, encoded: str) -> str:
        """The password; ConfigError when it was not encoded with this secret (or is not an
        encoded password at all)."""
        try:
            fields = dict(item.split(":", 1) for item in encoded.split(","))
            cipher = fields["cipherAlgorithm"]
            key_length = int(fields["keyLength"])
            key_factory = fields.get("keyFactoryAlgorithm") or "PBKDF2WithHmacSHA512"
            _check(key_factory, cipher, key_length)
            key = self._key(key_factory, key_length, _unb64(fields["salt"]), int(fields["iterations"]))
            iv, encrypted = _unb64(fields["initializationVector"]), _unb64(fields["encryptedPassword"])
            expected_length = int(fields["passwordLength"])
        except (KeyError, ValueError, binascii.Error) as exc:
            raise ConfigError(f"Password could not be decoded: not an encoded password ({exc})") from None
        from cryptography.exceptions import InvalidTag

        try:
            if cipher == _GCM:
                from cryptography.hazmat.primitives.ciphers.aead import AESGCM

                if int(fields.get("authenticationTagLength", _GCM_TAG_BITS)) != _GCM_TAG_BITS:
                    raise ValueError("only 128-bit GCM tags are supported")
                plain = AESGCM(key).decrypt(iv, encrypted, None)
            else:
                from cryptography.hazmat.primitives import padding
                from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

                decryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).decryptor()
                unpadder = padding.PKCS7(128).unpadder()
                plain = unpadder.update(decryptor.update(encrypted) + decryptor.finalize()) + unpadder.finalize()
            password = plain.decode()
        except (InvalidTag, ValueError, UnicodeDecodeError):
            raise ConfigError("Password could not be decoded") from None
        if len(password.encode("utf-16-le")) // 2 != expected_length:
            raise ConfigError("Password could not be decoded, sanity check of length failed")
        return password

    def _key(self, key_factory: str, key_length: int, salt: bytes, iterations: int) -> bytes:
        return hashlib.pbkdf2_hmac(_KEY_FACTORIES[key_factory], self._secret, salt, iterations, key_length // 8)


def encoder_from_config(config, secret_name: str = "password.encoder.secret") -> PasswordEncoder | None:
    """The encoder for `password.encoder.secret` (or the old secret), None when it is unset."""
    secret = config[secret_name]
    if secret is None:
        return None
    return PasswordEncoder(secret, config["password.encoder.keyfactory.algorithm"],
                           config["password.encoder.cipher.algorithm"], config["password.encoder.key.length"],
                           config["password.encoder.iterations"])


def _check(key_factory: str, cipher: str, key_length: int) -> None:
    if key_factory not in _KEY_FACTORIES:
        raise ConfigError(f"unsupported password.encoder.keyfactory.algorithm {key_factory!r}: "
                          f"expected one of {', '.join(KEY_FACTORY_ALGORITHMS)}")
    if cipher not in CIPHERS:
        raise ConfigError(f"unsupported password.encoder.cipher.algorithm {cipher!r}: expected one of "
                          f"{', '.join(CIPHERS)}")
    if key_length not in (128, 192, 256):
        raise ConfigError(f"invalid password.encoder.key.length {key_length}: AES takes 128, 192 or 256 bits")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)
