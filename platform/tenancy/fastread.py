"""Single-value reads for the per-call hot path, without the ORM's query compilation.

Only for trivial lookups of tenant-owned rows by tenant (the tenant id is always in the WHERE).
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
