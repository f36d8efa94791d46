"""Many rows at once for the tests that measure a list at scale: copies of one saved row in one statement."""
from django.db import connection


def copy_rows(obj, count: int, vary: dict[str, tuple[str, list]] | None = None) -> None:
    """`count` copies of `obj`'s row, inserted by one `INSERT … SELECT` on either database. Each column keeps
    `obj`'s value except a new primary key and the columns of `vary`: an SQL expression of `n` (1 to
    `count`) with its parameters. The copies are rows only: no signal, no audit entry, no chain."""
    meta = type(obj)._meta
    quote = connection.ops.quote_name
    pk = meta.pk
    columns, values, params = [], [], []
    for field in meta.concrete_fields:
        if field is pk and field.get_internal_type() in ("AutoField", "BigAutoField"):
            continue
        columns.append(quote(field.column))
        if field is pk:
            values.append("gen_random_uuid()" if connection.vendor == "postgresql" else "lower(hex(randomblob(16)))")
        elif field.column in (vary or {}):
            sql, sql_params = vary[field.column]
            values.append(sql)
            params.extend(sql_params)
        else:
            values.append("source." + quote(field.column))
    table = quote(meta.db_table)
    statement = " ".join([
        "WITH RECURSIVE numbers(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM numbers WHERE n < %s)",
        "INSERT INTO", table, "(" + ", ".join(columns) + ")",
        "SELECT", ", ".join(values), "FROM numbers,", table, "AS source WHERE source." + quote(pk.column) + " = %s",
    ])  # names from the model's metadata, values as parameters
    with connection.cursor() as cursor:
        cursor.execute(statement, [count, *params, pk.get_db_prep_value(obj.pk, connection)])
        if connection.vendor == "postgresql":
            # The statistics autovacuum would gather after such an insert: without them the planner takes
            # the table for its size before, and a join's plan costs seconds a real database never pays.
            cursor.execute("ANALYZE " + table)
