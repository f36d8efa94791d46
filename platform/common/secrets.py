"""Credentials the platform must send on a tenant's behalf (an MCP server's headers, a command's
environment), stored encrypted.

Such a credential has to be readable again, so it cannot be hashed like an API key; encrypting it means
a copy of the database (a backup, a replica, a leaked dump) does not hand it over without the key.
Fernet (AES-128-CBC with HMAC-SHA256, from `cryptography`) is authenticated: a changed ciphertext fails
to decrypt instead of decrypting to something else. The keys are `settings.TOOLKEEPER_SECRETS_KEYS`,
read from TOOLKEEPER_SECRETS_KEY (see settings): the first encrypts, every one decrypts, so a new key
goes first, `secret_rotate` re-encrypts what is stored, and then the old key can go. The key is apart
from SECRET_KEY on purpose: rotating one must not make the other unreadable.

Values are JSON objects (a dict of header name → value, env name → value). On a model they come back
as `SecretDict`, whose repr and str name no value, so a debug page, a log line or an error message that
shows the object does not show the secret; the field has no form field and cannot be compared in a
query (every encryption of the same value differs).

A row whose secret no configured key opens (a key lost or not yet configured) still loads: the field raises
SecretUnreadable when it is read, so the code that needs the value says what to do (enter it again), lists
and pages that show only names show none (`secret_names`), and saving the row keeps the ciphertext as it was.
"""
import json
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import FieldError, ValidationError
from django.db import models
from django.db.models.lookups import Exact, IsNull
from django.db.models.query_utils import DeferredAttribute

from common.json_values import json_problem


class SecretUnreadable(Exception):
    """A stored secret that the configured keys cannot decrypt."""


class SecretDict(dict):
    """A credential's value: a plain dict whose repr and str name no value."""

    def __repr__(self) -> str:
        return f"<secret: {len(self)} {'entry' if len(self) == 1 else 'entries'}>"

    __str__ = __repr__


@lru_cache(maxsize=4)
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    if not keys:
        raise SecretUnreadable("no key is configured for stored secrets (TOOLKEEPER_SECRETS_KEY)")
    return MultiFernet([Fernet(key) for key in keys])


def _keys() -> MultiFernet:
    return _fernet(tuple(settings.TOOLKEEPER_SECRETS_KEYS))


def secret_encrypt(value: dict) -> str:
    """The ciphertext of a JSON object, as text, under the first key."""
    if not isinstance(value, dict):
        raise TypeError(f"a stored secret is a JSON object (dict), not {type(value).__name__}")
    if problem := json_problem(value):
        raise ValueError(f"a stored secret cannot hold this value: {problem}")
    return _keys().encrypt(json.dumps(value, separators=(",", ":")).encode()).decode("ascii")


def secret_decrypt(token: str) -> SecretDict:
    """The JSON object a ciphertext holds; SecretUnreadable when no configured key opens it."""
    try:
        plain = _keys().decrypt(token.encode("ascii") if isinstance(token, str) else token)
    except (InvalidToken, UnicodeError, TypeError):
        raise SecretUnreadable(
            "a stored secret cannot be decrypted with the configured keys (TOOLKEEPER_SECRETS_KEY): the key it was "
            "encrypted with is missing from the list, or the stored text was changed") from None
    return SecretDict(json.loads(plain))


def secret_rotate(token: str) -> str:
    """The ciphertext re-encrypted under the first key (the value unchanged), so older keys can go."""
    try:
        return _keys().rotate(token.encode("ascii")).decode("ascii")
    except (InvalidToken, UnicodeError):
        raise SecretUnreadable("a stored secret cannot be decrypted with the configured keys "
                               "(TOOLKEEPER_SECRETS_KEY), so it cannot be re-encrypted") from None


class _Unreadable:
    """Text given for an encrypted field (a fixture's) that no configured key opens: refused when saved."""

    def __repr__(self) -> str:
        return "<text no configured key opens>"

    __str__ = __repr__


UNREADABLE = _Unreadable()


class SealedSecret:
    """A stored ciphertext that no configured key opens, as loaded. The row still loads (a list of servers or
    tools stays up); reading the field raises SecretUnreadable, where the caller can say what to do (enter the
    credential again); saving the row writes the ciphertext back as it was."""

    __slots__ = ("token",)

    def __init__(self, token: str):
        self.token = token

    def __repr__(self) -> str:
        return "<secret: unreadable>"

    __str__ = __repr__


class SecretAttribute(DeferredAttribute):
    """Whatever is assigned to the field (by a constructor, a load, a form) is held as a SecretDict; a value
    loaded sealed raises SecretUnreadable when read."""

    def __get__(self, instance, cls=None):
        value = super().__get__(instance, cls)
        if isinstance(value, SealedSecret):
            value = secret_decrypt(value.token)  # SecretUnreadable, unless a key configured since opens it
            instance.__dict__[self.field.attname] = value
        return value

    def __set__(self, instance, value) -> None:
        if isinstance(value, dict) and not isinstance(value, SecretDict):
            value = SecretDict(value)
        instance.__dict__[self.field.attname] = value


def secret_readable(instance, attname: str):
    """A model's stored secret, or None when no configured key opens it."""
    try:
        return getattr(instance, attname)
    except SecretUnreadable:
        return None


def secret_names(instance, attname: str) -> list[str]:
    """The names a stored secret holds, sorted (never a value); none when no configured key opens it."""
    return sorted(secret_readable(instance, attname) or {})


class NoComparison(Exact):
    """`field=None` still works (Django turns it into `isnull`); comparing with a value is refused."""

    def get_prep_lookup(self):
        if self.rhs is not None:
            raise FieldError(f"{self.lhs.output_field.name} is encrypted: it cannot be compared in a query")
        return None


class EncryptedJSONField(models.Field):
    """A JSON object stored encrypted in a text column (`secret_encrypt`); read back as a SecretDict."""

    description = "A JSON object, stored encrypted"
    descriptor_class = SecretAttribute
    empty_strings_allowed = False

    def get_internal_type(self) -> str:
        return "TextField"

    def from_db_value(self, value, expression, connection):
        if value is None:
            return None
        try:
            return secret_decrypt(value)
        except SecretUnreadable:
            return SealedSecret(value)

    def to_python(self, value):
        """The value itself (a model's, a form's), or the ciphertext a fixture holds read back (`loaddata`).
        Text is always taken for a ciphertext, as `value_to_string` writes one. Text no configured key opens
        becomes UNREADABLE, refused when saved: raised here, Django's deserializer would quote the text in
        its message, and the text may be the value itself. A fixture that holds the value as a JSON object
        loads it as it is (encrypted when saved, like any value)."""
        if not isinstance(value, str):
            return value
        if not value:
            return None  # what `value_to_string` writes for None
        try:
            return secret_decrypt(value)
        except SecretUnreadable:
            return UNREADABLE

    def pre_save(self, model_instance, add):
        held = model_instance.__dict__.get(self.attname)
        return held if isinstance(held, SealedSecret) else super().pre_save(model_instance, add)

    def get_prep_value(self, value):
        if value is None:
            return None
        if isinstance(value, SealedSecret):
            return value.token  # written back unchanged: no key here can read it, a restored key still may
        if value is UNREADABLE:
            raise ValueError(f"{self.name}: the text given is not a ciphertext the configured keys "
                             "(TOOLKEEPER_SECRETS_KEY) open; a fixture holds what `dumpdata` wrote under one of them, "
                             "or the value as a JSON object")
        return secret_encrypt(value)

    def validate(self, value, model_instance) -> None:
        if value is not None and not isinstance(value, dict):
            raise ValidationError("Enter a JSON object.", code="invalid")
        if value is not None and (problem := json_problem(value)):
            raise ValidationError(problem, code="invalid")
        super().validate(value, model_instance)

    def value_to_string(self, obj) -> str:
        """What a fixture or a backup holds (Django's serializers, `dumpdata`): the ciphertext, never the value;
        `to_python` reads it back."""
        held = obj.__dict__.get(self.attname)
        if isinstance(held, SealedSecret):
            return held.token
        value = self.value_from_object(obj)
        return "" if value is None else secret_encrypt(value)

    def formfield(self, **kwargs):
        return None  # a credential is written by its own form, never shown back in a generic one

    def get_lookup(self, lookup_name):
        if lookup_name == "exact":
            return NoComparison
        if lookup_name == "isnull":
            return IsNull
        return None
