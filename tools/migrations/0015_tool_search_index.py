"""The tool search's index on PostgreSQL (tools/catalog/search.py explains the search): a generated, stored
tsvector column `tools_tool.search` — the name with `_`, `.` and `-` read as spaces (weight A), the description
(B), the input schema's property names and descriptions at any depth (C; `silent`: a malformed schema adds
nothing, never fails a write), in the `english` configuration, each text cut at 100,000 characters (a tsvector
holds at most 1 MB) — and a GIN index on it, built with fastupdate off (a pending list left by a bulk sync
makes the planner shun the index). SQLite needs nothing: the embedded mode searches the catalog snapshot. The SQL is spelled out here so this
migration never changes with the application code.

Caution for later migrations: `name`, `description` and `input_schema` cannot change type while the generated
column uses them; drop it first and add it again after."""
from django.db import migrations

POSTGRES_INSTALL = [
    "ALTER TABLE tools_tool ADD COLUMN search tsvector GENERATED ALWAYS AS ("
    " setweight(to_tsvector('english'::regconfig, regexp_replace(coalesce(name, ''), '[_.-]+', ' ', 'g')), 'A') ||"
    " setweight(to_tsvector('english'::regconfig, left(coalesce(description, ''), 100000)), 'B') ||"
    " setweight(to_tsvector('english'::regconfig, left("
    " coalesce(jsonb_path_query_array(input_schema, 'strict $.**.properties.keyvalue().key', '{}', true)::text, '')"
    " || ' ' ||"
    " coalesce(jsonb_path_query_array(input_schema, 'strict $.**.description', '{}', true)::text, ''), 100000)),"
    " 'C')) STORED",
    "CREATE INDEX tools_tool_search_gin ON tools_tool USING gin (search) WITH (fastupdate = off)",
]
POSTGRES_UNINSTALL = [
    "DROP INDEX IF EXISTS tools_tool_search_gin",
    "ALTER TABLE tools_tool DROP COLUMN IF EXISTS search",
]


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in POSTGRES_INSTALL:
            schema_editor.execute(statement, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in POSTGRES_UNINSTALL:
            schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('tools', '0014_upstream_prompts'),
    ]

    operations = [
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
