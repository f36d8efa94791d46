"""Stored credentials in backups: `dumpdata` (Django's serializers) writes the ciphertext, never the value, and
`loaddata` of that output restores the same value. A fixture written by hand with the value in plain JSON is
encrypted as it is loaded; text that no configured key opens is refused, naming the field and no value."""
import io
import json

import pytest
from cryptography.fernet import Fernet
from django.apps import apps
from django.core import serializers
from django.core.management import call_command
from django.test import override_settings

from common.secrets import UNREADABLE, EncryptedJSONField, SecretDict, secret_decrypt, secret_encrypt
from tools.models import McpServer

pytestmark = pytest.mark.django_db

TOKEN = "Bearer ghp_dump-5ecret-81fa"  # noqa: S105
ENV_SECRET = "sk-dump-env-5ecret-c0de"  # noqa: S105
HEADERS = {"Authorization": TOKEN}


def server(world, **fields) -> McpServer:
    values = {"tenant": world.a.tenant, "name": "github", "transport": "streamable_http",
              "url": "https://93.184.215.14/mcp", "headers": HEADERS, **fields}
    return McpServer.objects.create(**values)


def dump(fmt: str = "json") -> str:
    out = io.StringIO()
    call_command("dumpdata", "tools.McpServer", "--all", "--format", fmt, stdout=out)
    return out.getvalue()


def load(tmp_path, text: str, fmt: str = "json") -> None:
    fixture = tmp_path / f"servers.{fmt}"
    fixture.write_text(text)
    call_command("loaddata", str(fixture), verbosity=0)


def test_every_credential_field_of_every_model_serialises_as_ciphertext():
    fields = [(model, field) for model in apps.get_models() for field in model._meta.fields
              if isinstance(field, EncryptedJSONField)]
    assert {f"{model._meta.label}.{field.name}" for model, field in fields} >= {
        "tools.McpServer.headers", "tools.McpServer.env", "tools.HttpEndpoint.secrets",
        "approvals.NotificationChannel.target", "tools.ToolCall.unredacted_result"}
    for model, field in fields:
        instance = model(**{field.attname: HEADERS})
        text = field.value_to_string(instance)
        assert TOKEN not in text and secret_decrypt(text) == HEADERS, field
        assert field.to_python(text) == HEADERS


@pytest.mark.parametrize("fmt", ["json", "jsonl", "xml", "yaml"])
def test_dumpdata_writes_the_ciphertext_and_loaddata_restores_the_value(world, tmp_path, fmt):
    saved = server(world)
    stdio = server(world, name="files", transport="stdio", url="", headers=None, command="files",
                   env={"API_TOKEN": ENV_SECRET})
    output = dump(fmt)
    assert TOKEN not in output and ENV_SECRET not in output and "Authorization" not in output
    records = {obj.object.pk: obj for obj in serializers.deserialize(fmt, output, ignorenonexistent=True)}
    assert records[saved.pk].object.headers == HEADERS  # the text in the dump is the ciphertext of the value
    assert records[stdio.pk].object.env == {"API_TOKEN": ENV_SECRET}

    McpServer.all_tenants.all().delete()
    load(tmp_path, output, fmt)
    restored = McpServer.objects.for_tenant(world.a.tenant).get(pk=saved.pk)
    assert restored.headers == HEADERS and isinstance(restored.headers, SecretDict)
    assert restored.env is None
    assert McpServer.objects.for_tenant(world.a.tenant).get(pk=stdio.pk).env == {"API_TOKEN": ENV_SECRET}


def test_the_dump_holds_a_ciphertext_of_the_value_under_the_configured_key(world):
    saved = server(world)
    (record,) = [r for r in json.loads(dump()) if r["pk"] == saved.pk]
    ciphertext = record["fields"]["headers"]
    assert isinstance(ciphertext, str) and ciphertext.startswith("gAAAAA")  # a Fernet token
    assert secret_decrypt(ciphertext) == HEADERS
    assert record["fields"]["env"] is None


def test_a_dump_under_a_key_no_longer_configured_is_refused_clearly(world, tmp_path):
    old = Fernet.generate_key().decode()
    with override_settings(TOOLKEEPER_SECRETS_KEYS=[old]):
        saved = server(world)
        output = dump()
        McpServer.all_tenants.filter(pk=saved.pk).delete()
    with pytest.raises(ValueError, match=r"Could not load tools.McpServer\(pk=\d+\): headers: ") as raised:
        load(tmp_path, output)
    message = str(raised.value)
    assert ("headers: the text given is not a ciphertext the configured keys (TOOLKEEPER_SECRETS_KEY) open; a "
            "fixture holds what `dumpdata` wrote under one of them, or the value as a JSON object") in message
    assert TOKEN not in message
    assert not McpServer.all_tenants.filter(pk=saved.pk).exists()


def test_a_fixture_holding_the_value_in_plain_json_is_encrypted_as_it_loads(world, tmp_path):
    """Decided: a hand-written fixture (or a backup made before this rule) still loads, and the database
    holds only ciphertext from then on; a dump of it holds no plain value either."""
    saved = server(world)
    records = json.loads(dump())
    McpServer.all_tenants.all().delete()
    for record in records:
        record["fields"]["headers"] = {"Authorization": TOKEN}
    load(tmp_path, json.dumps(records))
    assert McpServer.objects.for_tenant(world.a.tenant).get(pk=saved.pk).headers == HEADERS
    assert TOKEN not in dump()


@pytest.mark.parametrize("text", ["Bearer plain", json.dumps(HEADERS), "gAAAAAnot-a-token"])
def test_text_that_is_no_ciphertext_is_refused_naming_the_field_not_the_value(world, tmp_path, text):
    """A string is what a dump writes, so it must be a ciphertext: JSON of the value in a string (as an XML
    fixture holds every field) is not taken for one."""
    saved = server(world)
    records = json.loads(dump())
    McpServer.all_tenants.all().delete()
    records[0]["fields"]["headers"] = text
    with pytest.raises(ValueError, match=r"Could not load tools.McpServer\(pk=\d+\): headers: ") as raised:
        load(tmp_path, json.dumps(records))
    assert TOKEN not in str(raised.value) and "plain" not in str(raised.value)
    assert not McpServer.all_tenants.filter(pk=saved.pk).exists()


def test_to_python_reads_a_ciphertext_and_leaves_a_value_as_it_is():
    field = McpServer._meta.get_field("headers")
    assert field.to_python(secret_encrypt(HEADERS)) == HEADERS
    assert field.to_python(SecretDict(HEADERS)) == HEADERS
    assert field.to_python(None) is None and field.to_python("") is None


def test_an_empty_credential_serialises_as_empty_text_and_reads_back_as_none():
    field = McpServer._meta.get_field("headers")
    assert field.value_to_string(McpServer(headers=None)) == ""
    assert field.to_python(field.value_to_string(McpServer(headers=None))) is None


def test_text_no_key_opens_is_held_as_a_marker_that_shows_no_text():
    field = McpServer._meta.get_field("headers")
    held = field.to_python("Bearer plain")
    assert held is UNREADABLE
    assert repr(held) == str(held) == "<text no configured key opens>"
