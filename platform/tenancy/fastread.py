"""Small generic statements outside the ORM's usual path, for hot paths: single values of tenant-owned
rows (the tenant id always in the WHERE), appending a row, and whether tables exist yet. The statements
particular to a call's path are in `tools.call_statements`.
"""
from django.db import connection


def tenant_scalar(model, column: str, tenant_id: int, *, order_by_id_desc: bool = False):
    """`SELECT <column> FROM <model's table> WHERE tenant_id = %s [ORDER BY id DESC] LIMIT 1`, or None."""
    quote = connection.ops.quote_name
    meta = model._meta
    order = f" ORDER BY {quote(meta.pk.column)} DESC" if order_by_id_desc else ""
    sql = (f"SELECT {quote(meta.get_field(column).column)} FROM {quote(meta.db_table)} "  # noqa: S608
           f"WHERE {quote(meta.get_field('tenant').column)} = %s{order} LIMIT 1")
    with connection.cursor() as cursor:
        cursor.execute(sql, [tenant_id])
        row = cursor.fetchone()
    return row[0] if row else None


def insert_row(model, **values) -> int:
    """INSERT one row of `model` (values by field name, prepared as the ORM prepares them); returns its id.

    No save machinery: no signals, no field defaults. For append-only rows (call events, audit
    events) written several times per call, where building and compiling an ORM insert costs more
    than the statement itself.
    """
    quote = connection.ops.quote_name
    meta = model._meta
    columns, params = [], []
    for name, value in values.items():
        field = meta.get_field(name)
        columns.append(quote(field.column))
        params.append(field.get_db_prep_save(value, connection))
    sql = (f"INSERT INTO {quote(meta.db_table)} ({', '.join(columns)}) "  # noqa: S608 (identifiers from metadata)
           f"VALUES ({', '.join(['%s'] * len(columns))}) RETURNING {quote(meta.pk.column)}")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def tables_exist(*models) -> bool:
    """Whether the models' tables exist (after `migrate … zero` they do not; post-migrate hooks then do nothing)."""
    names = set(connection.introspection.table_names())
    return all(model._meta.db_table in names for model in models)
