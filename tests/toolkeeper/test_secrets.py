"""Credentials at rest: encrypted in the column, readable with any configured key, written with the first,
refused clearly under a wrong key, and never shown by a repr or an error message."""
import base64
import os
import stat
import threading

import pytest
from cryptography.fernet import Fernet
from django.apps.registry import Apps
from django.core.exceptions import FieldError, ImproperlyConfigured, ValidationError
from django.db import connection, models
from django.test import override_settings

from common.secrets import (
    EncryptedJSONField,
    SecretDict,
    SecretUnreadable,
    secret_decrypt,
    secret_encrypt,
    secret_names,
    secret_rotate,
)
from toolkeeper.settings import DEV_SECRETS_KEY_FILE, development_secrets_key, secrets_keys

PLAIN = "Bearer tk-very-secret-value"
VALUE = {"Authorization": PLAIN, "X-Team": "ops"}
OLD, NEW = Fernet.generate_key().decode(), Fernet.generate_key().decode()


class Vault(models.Model):
    """A model of this test only, in a registry of its own: its table is made and dropped by the test."""

    credentials = EncryptedJSONField(null=True, blank=True)

    class Meta:
        app_label = "secrets_test"
        apps = Apps()
        db_table = "secrets_test_vault"

    def __str__(self):
        return f"vault {self.pk}"


class Strongbox(models.Model):
    """A required credential (neither null nor blank), for the field's validation; no table is made."""

    credentials = EncryptedJSONField()

    class Meta:
        app_label = "secrets_test"
        apps = Apps()

    def __str__(self):
        return "strongbox"


@pytest.fixture
def vault(transactional_db):
    with connection.schema_editor() as editor:
        editor.create_model(Vault)
    yield Vault
    with connection.schema_editor() as editor:
        editor.delete_model(Vault)


def raw_column(pk) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT credentials FROM secrets_test_vault WHERE id = %s", [pk])
        return cursor.fetchone()[0]


# -- the helpers ------------------------------------------------------------------------------------

def test_round_trip():
    token = secret_encrypt(VALUE)
    assert secret_decrypt(token) == VALUE
    assert isinstance(secret_decrypt(token), SecretDict)
    nested = {"env": {"API_TOKEN": PLAIN}, "list": [1, "é", None, 2.5, True], "emoji": "🔑"}
    assert secret_decrypt(secret_encrypt(nested)) == nested
    assert secret_decrypt(token.encode("ascii")) == VALUE  # a ciphertext read back as bytes


def test_the_plain_text_under_the_key_is_compact_json():
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[NEW]):
        token = secret_encrypt(VALUE)
    plain = Fernet(NEW).decrypt(token.encode("ascii"))
    assert plain == b'{"Authorization":"Bearer tk-very-secret-value","X-Team":"ops"}'


def test_the_ciphertext_shows_nothing_and_differs_each_time():
    first, second = secret_encrypt(VALUE), secret_encrypt(VALUE)
    assert first != second
    for token in (first, second):
        assert PLAIN not in token and "Authorization" not in token
        assert PLAIN not in base64.urlsafe_b64decode(token).decode("latin-1")
        assert token.isascii()


def test_a_wrong_key_fails_clearly_and_names_no_secret():
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[OLD]):
        token = secret_encrypt(VALUE)
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[NEW]), pytest.raises(SecretUnreadable) as refused:
        secret_decrypt(token)
    message = str(refused.value)
    assert message == ("a stored secret cannot be decrypted with the configured keys (TOOLKEEPER_SECRETS_KEY): "
                       "the key it was encrypted with is missing from the list, or the stored text was changed")
    for secret in (PLAIN, token, OLD, NEW):
        assert secret not in message
    assert refused.value.__cause__ is None and refused.value.__suppress_context__


def test_a_changed_ciphertext_fails_clearly():
    token = secret_encrypt(VALUE)
    tampered = token[:-6] + ("A" if token[-6] != "A" else "B") + token[-5:]
    for bad in (tampered, "not a token", "", "é"):
        with pytest.raises(SecretUnreadable):
            secret_decrypt(bad)


def test_rotation_old_keys_decrypt_the_first_encrypts():
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[OLD]):
        old_token = secret_encrypt(VALUE)
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[NEW, OLD]):
        assert secret_decrypt(old_token) == VALUE  # the old key still decrypts
        new_token = secret_encrypt(VALUE)
        rotated = secret_rotate(old_token)
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[NEW]):  # the old key removed
        assert secret_decrypt(new_token) == VALUE
        assert secret_decrypt(rotated) == VALUE
        with pytest.raises(SecretUnreadable):
            secret_decrypt(old_token)
        with pytest.raises(SecretUnreadable) as refused:
            secret_rotate(old_token)
        assert str(refused.value) == ("a stored secret cannot be decrypted with the configured keys "
                                      "(TOOLKEEPER_SECRETS_KEY), so it cannot be re-encrypted")
        assert refused.value.__cause__ is None and refused.value.__suppress_context__
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[OLD]), pytest.raises(SecretUnreadable):
        secret_decrypt(new_token)  # the new key encrypted it


def test_only_json_objects_are_stored_and_the_refusal_names_no_value():
    for value, kind in ((PLAIN, "str"), ([PLAIN], "list"), (42, "int")):
        with pytest.raises(TypeError) as refused:
            secret_encrypt(value)
        assert str(refused.value) == f"a stored secret is a JSON object (dict), not {kind}"
        assert PLAIN not in str(refused.value)
    for unstorable, problem in (({"token": PLAIN, "n": float("nan")}, "finite"),
                                ({"token": PLAIN, "bad": "\ud800"}, "lone surrogate")):
        with pytest.raises(ValueError, match=problem) as refused:  # the platform's rules for stored JSON
            secret_encrypt(unstorable)
        assert PLAIN not in str(refused.value)


def test_a_secret_dict_shows_no_value():
    value = SecretDict(VALUE)
    for shown in (repr(value), str(value), f"{value}", repr([value]), repr({"headers": value})):
        assert PLAIN not in shown and "ops" not in shown
    assert repr(value) == "<secret: 2 entries>"
    one = SecretDict({"Authorization": PLAIN})
    assert repr(one) == str(one) == "<secret: 1 entry>"
    assert value == VALUE and dict(value) == VALUE and value["Authorization"] == PLAIN


# -- the field, without a database --------------------------------------------------------------------

def test_the_field_encrypts_for_the_database_and_decrypts_from_it():
    field = Vault._meta.get_field("credentials")
    stored = field.get_prep_value(VALUE)
    assert PLAIN not in stored
    assert field.from_db_value(stored, None, connection) == VALUE
    assert field.get_prep_value(None) is None and field.from_db_value(None, None, connection) is None
    assert field.get_internal_type() == "TextField"
    assert field.formfield() is None


def test_the_field_deconstructs_for_migrations():
    name, path, args, kwargs = Vault._meta.get_field("credentials").deconstruct()
    assert (name, path, args, kwargs) == ("credentials", "common.secrets.EncryptedJSONField", [],
                                          {"null": True, "blank": True})
    rebuilt = EncryptedJSONField(*args, **kwargs)
    assert rebuilt.null and rebuilt.blank


def test_a_model_shows_no_value():
    vault = Vault(credentials=VALUE)
    assert isinstance(vault.credentials, SecretDict)
    vault.credentials = {"Authorization": PLAIN}
    assert isinstance(vault.credentials, SecretDict)
    for shown in (str(vault), repr(vault), repr(vault.__dict__), str(vault.credentials)):
        assert PLAIN not in shown


def test_validation_errors_name_no_value():
    vault = Vault(credentials=[PLAIN])
    with pytest.raises(ValidationError) as refused:
        vault.clean_fields()
    assert refused.value.message_dict == {"credentials": ["Enter a JSON object."]}
    assert refused.value.error_dict["credentials"][0].code == "invalid"
    assert PLAIN not in str(refused.value)


def test_validation_takes_json_objects_and_applies_the_platform_rules_for_stored_json():
    Vault(credentials=VALUE).clean_fields()
    Vault(credentials=None).clean_fields()  # null and blank allowed on this field
    Strongbox(credentials=VALUE).clean_fields()
    for empty, code in ((None, "null"), ({}, "blank")):  # Django's own checks still apply
        with pytest.raises(ValidationError) as refused:
            Strongbox(credentials=empty).clean_fields()
        assert refused.value.error_dict["credentials"][0].code == code
    with pytest.raises(ValidationError) as refused:
        Vault(credentials={"token": PLAIN, "n": float("nan")}).clean_fields()
    (error,) = refused.value.error_dict["credentials"]
    assert error.code == "invalid" and "finite" in error.message and PLAIN not in error.message


def test_a_query_cannot_compare_an_encrypted_value():
    with pytest.raises(FieldError, match="credentials is encrypted: it cannot be compared in a query"):
        Vault.objects.filter(credentials=VALUE)
    with pytest.raises(FieldError):
        Vault.objects.filter(credentials__contains="Bearer")
    assert "IS NULL" in str(Vault.objects.filter(credentials=None).query)
    assert "IS NULL" in str(Vault.objects.filter(credentials__isnull=True).query)


# -- the field, in a real table ------------------------------------------------------------------------

def test_the_column_holds_ciphertext_and_the_model_the_value(vault):
    saved = vault.objects.create(credentials=VALUE)
    raw = raw_column(saved.pk)
    assert PLAIN not in raw and "Authorization" not in raw
    assert secret_decrypt(raw) == VALUE
    loaded = vault.objects.get(pk=saved.pk)
    assert loaded.credentials == VALUE and isinstance(loaded.credentials, SecretDict)
    assert PLAIN not in repr(loaded.credentials)

    vault.objects.filter(pk=saved.pk).update(credentials={"X-Token": PLAIN})
    assert PLAIN not in raw_column(saved.pk)
    loaded.refresh_from_db()
    assert loaded.credentials == {"X-Token": PLAIN}

    empty = vault.objects.create(credentials=None)
    assert raw_column(empty.pk) is None
    assert list(vault.objects.filter(credentials=None)) == [empty]


def test_saving_credentials_that_were_not_loaded_keeps_them(vault):
    """A save naming the field of an instance loaded without it reads the stored value first, never
    writes an empty one in its place."""
    saved = vault.objects.create(credentials=VALUE)
    deferred = vault.objects.defer("credentials").get(pk=saved.pk)
    deferred.save(update_fields=["credentials"])
    assert secret_decrypt(raw_column(saved.pk)) == VALUE


def test_a_row_under_a_lost_key_loads_and_fails_clearly_when_read(vault):
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[OLD]):
        saved = vault.objects.create(credentials=VALUE)
    stored = raw_column(saved.pk)
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[NEW]):
        loaded = vault.objects.get(pk=saved.pk)  # a list of such rows still shows
        assert repr(loaded.__dict__["credentials"]) == "<secret: unreadable>"
        for _ in range(2):  # every read, not only the first
            with pytest.raises(SecretUnreadable) as refused:
                loaded.credentials  # noqa: B018
            assert PLAIN not in str(refused.value)
        assert secret_names(loaded, "credentials") == []
        assert vault._meta.get_field("credentials").value_to_string(loaded) == stored  # a backup keeps it
        loaded.save()  # written back as it was: a restored key still opens it
        assert raw_column(saved.pk) == stored
        deferred = vault.objects.defer("credentials").get(pk=saved.pk)
        with pytest.raises(SecretUnreadable):
            deferred.credentials  # noqa: B018
        loaded.credentials = {"X-New": "v"}  # entered again
        loaded.save()
        assert vault.objects.get(pk=saved.pk).credentials == {"X-New": "v"}
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[NEW, OLD]):
        assert secret_decrypt(stored) == VALUE
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[OLD]):
        held = vault.objects.create(credentials=VALUE)
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[NEW]):
        sealed = vault.objects.get(pk=held.pk)
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[NEW, OLD]):  # a key configured after the load opens it
        assert sealed.credentials == VALUE and secret_names(sealed, "credentials") == ["Authorization", "X-Team"]


# -- the key --------------------------------------------------------------------------------------------

def test_without_a_key_production_refuses_to_start(tmp_path):
    with pytest.raises(ImproperlyConfigured, match="TOOLKEEPER_SECRETS_KEY must be set when DEBUG is off"):
        secrets_keys("", debug=False, data_dir=tmp_path)
    with pytest.raises(ImproperlyConfigured):
        secrets_keys(" , ", debug=False, data_dir=tmp_path)
    assert not (tmp_path / DEV_SECRETS_KEY_FILE).exists()  # no development key made for production


def test_keys_come_from_the_variable_first_one_first(tmp_path):
    assert secrets_keys(f" {NEW} ,{OLD}", debug=False, data_dir=tmp_path) == [NEW, OLD]
    assert secrets_keys(NEW, debug=True, data_dir=tmp_path) == [NEW]
    assert not (tmp_path / DEV_SECRETS_KEY_FILE).exists()


def test_a_malformed_key_is_refused_without_showing_it(tmp_path):
    bad = "not-a-fernet-key-but-a-secret-anyway"
    with pytest.raises(ImproperlyConfigured, match="key 2 of 2 is not a Fernet key") as refused:
        secrets_keys(f"{NEW},{bad}", debug=False, data_dir=tmp_path)
    assert bad not in str(refused.value) and NEW not in str(refused.value)


def test_development_key_is_made_once_readable_by_its_owner_only(tmp_path, caplog):
    keys = secrets_keys("", debug=True, data_dir=tmp_path)
    path = tmp_path / DEV_SECRETS_KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    Fernet(keys[0])  # a usable key
    assert "TOOLKEEPER_SECRETS_KEY is not set" in caplog.text and keys[0] not in caplog.text
    written = path.stat().st_mtime_ns
    assert secrets_keys("", debug=True, data_dir=tmp_path) == keys  # reused, not replaced
    assert path.stat().st_mtime_ns == written
    assert sorted(p.name for p in tmp_path.iterdir()) == [DEV_SECRETS_KEY_FILE]  # no draft left behind


def test_processes_starting_together_agree_on_the_development_key(tmp_path):
    path, keys, start = tmp_path / DEV_SECRETS_KEY_FILE, [], threading.Barrier(8)

    def make():
        start.wait()
        keys.append(development_secrets_key(path))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(keys) == 8 and len(set(keys)) == 1
    assert path.read_text().strip() == keys[0]
    assert os.listdir(tmp_path) == [DEV_SECRETS_KEY_FILE]
