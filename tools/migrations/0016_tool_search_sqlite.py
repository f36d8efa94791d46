"""The tool search's index on SQLite (tools/catalog/search.py explains the search): an FTS5 table
`tools_tool_fts(tenant, name, description, schema)` (Porter stemming), one row per tool (rowid = the tool's id),
kept in sync with `tools_tool` by triggers. It indexes what migration 0015 indexes on PostgreSQL: the name with
`_`, `.` and `-` read as spaces, the description, and the input schema's property names and description strings
at any depth, each text cut at 100,000 characters; `tenant` holds `t<tenant id>`, so a query matches one
tenant's rows alone. A schema that is not valid JSON, or not shaped like a JSON Schema, adds nothing: the
triggers never fail a write. PostgreSQL needs nothing here (migration 0015). The SQL is spelled out here so this
migration never changes with the application code.

Caution for later migrations: on SQLite, Django rebuilds a table to alter it, which drops its triggers. A
migration that alters `tools_tool` must run SQLITE_UNINSTALL and SQLITE_INSTALL of this migration again
afterwards (they re-create the table and re-index every tool)."""
from django.db import migrations

_NAME = "replace(replace(replace(coalesce({row}.name, ''), '_', ' '), '.', ' '), '-', ' ')"
_DESCRIPTION = "substr(coalesce({row}.description, ''), 1, 100000)"
# the schema's text: keys of any object held under a key `properties`, and any string under a key `description`
_JSON = "CASE WHEN json_valid({row}.input_schema) THEN {row}.input_schema ELSE '{{}}' END"
_SCHEMA = (
    "coalesce(substr((SELECT group_concat(part, ' ') FROM ("  # noqa: S608 (constant SQL)
    f" SELECT node.key AS part FROM json_tree({_JSON}) AS node"
    "  WHERE typeof(node.key) = 'text' AND substr(node.path, -11) = '.properties'"
    " UNION ALL"
    f" SELECT node.value FROM json_tree({_JSON}) AS node"
    "  WHERE node.key = 'description' AND node.type = 'text')), 1, 100000), '')"
)
_VALUES = f"'t' || {{row}}.tenant_id, {_NAME}, {_DESCRIPTION}, {_SCHEMA}"


def _values(row: str) -> str:
    return _VALUES.format(row=row)


SQLITE_INSTALL = [
    "CREATE VIRTUAL TABLE IF NOT EXISTS tools_tool_fts USING fts5("
    " tenant, name, description, schema, tokenize='porter unicode61 remove_diacritics 2')",
    "CREATE TRIGGER IF NOT EXISTS tools_tool_fts_ai AFTER INSERT ON tools_tool BEGIN"  # noqa: S608 (constant SQL)
    " INSERT INTO tools_tool_fts(rowid, tenant, name, description, schema)"
    f" VALUES (new.id, {_values('new')}); END",
    "CREATE TRIGGER IF NOT EXISTS tools_tool_fts_ad AFTER DELETE ON tools_tool BEGIN"
    " DELETE FROM tools_tool_fts WHERE rowid = old.id; END",
    "CREATE TRIGGER IF NOT EXISTS tools_tool_fts_au"  # noqa: S608 (constant SQL)
    " AFTER UPDATE OF id, tenant_id, name, description, input_schema ON tools_tool BEGIN"
    " DELETE FROM tools_tool_fts WHERE rowid = old.id;"
    " INSERT INTO tools_tool_fts(rowid, tenant, name, description, schema)"
    f" VALUES (new.id, {_values('new')}); END",
    "DELETE FROM tools_tool_fts",
    "INSERT INTO tools_tool_fts(rowid, tenant, name, description, schema)"  # noqa: S608 (no input: constant SQL)
    f" SELECT tool.id, {_values('tool')} FROM tools_tool AS tool",
]
SQLITE_UNINSTALL = [
    "DROP TRIGGER IF EXISTS tools_tool_fts_au",
    "DROP TRIGGER IF EXISTS tools_tool_fts_ad",
    "DROP TRIGGER IF EXISTS tools_tool_fts_ai",
    "DROP TABLE IF EXISTS tools_tool_fts",
]


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_INSTALL:
            schema_editor.execute(statement, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_UNINSTALL:
            schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('tools', '0015_tool_search_index'),
    ]

    operations = [
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
