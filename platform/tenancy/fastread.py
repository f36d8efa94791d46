"""Small generic statements outside the ORM's usual path, for hot paths: single values of tenant-owned
rows (the tenant id always in the WHERE), one row found by equal fields, appending a row, and whether
tables exist yet. The statements particular to a call's path are in `tools.call_statements`.
"""
import threading
from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS, connection, connections


def this_connection():
    """This thread's default connection. Hot statements take it once: every attribute read through
    `django.db.connection` looks the connection up again (about 2 µs), and preparing one statement's values
    reads it dozens of times."""
    return connections[DEFAULT_DB_ALIAS]


_shapes = threading.local()  # per thread, as converters come from the thread's own connection


@dataclass(frozen=True)
class _Shape:
    """How to select every concrete column of a model and turn a row back into an instance."""
    columns: str
    attnames: list[str]
    converters: list[tuple[int, list]]  # (index, [converter]) for the columns that have any
    expressions: list


def _shape(conn, model) -> _Shape:
    cache = getattr(_shapes, "by_model", None)
    if cache is None:
        cache = _shapes.by_model = {}
    shape = cache.get(model)
    if shape is None:
        quote = conn.ops.quote_name
        meta = model._meta
        fields = meta.concrete_fields
        expressions = [field.get_col(meta.db_table) for field in fields]
        converters = []
        for index, expression in enumerate(expressions):
            found = conn.ops.get_db_converters(expression) + expression.get_db_converters(conn)
            if found:
                converters.append((index, found))
        shape = cache[model] = _Shape(
            columns=", ".join(f"{quote(meta.db_table)}.{quote(field.column)}" for field in fields),
            attnames=[field.attname for field in fields], converters=converters, expressions=expressions)
    return shape


def _instance(conn, model, shape: _Shape, values: list):
    for index, found in shape.converters:
        for convert in found:
            values[index] = convert(values[index], shape.expressions[index], conn)
    return model.from_db(conn.alias, shape.attnames, values)


def fetch_one(model, *, join: str | None = None, **equal):
    """The row of `model` whose fields equal these values, as an instance (None when there is none), read
    with one plain statement instead of a compiled queryset; `join` names a foreign key whose row is loaded
    with it, as `select_related` would. For lookups on a request's hot path (its API key, its session), where
    building the queryset costs several times the statement. Values are prepared as the ORM prepares
    them: a malformed one raises ValidationError, ValueError or TypeError, as a queryset filter does."""
    conn = this_connection()
    quote = conn.ops.quote_name
    meta = model._meta
    shape = _shape(conn, model)
    columns, source = shape.columns, quote(meta.db_table)
    related = None
    if join is not None:
        foreign_key = meta.get_field(join)
        related = foreign_key.related_model
        related_shape = _shape(conn, related)
        related_meta = related._meta
        columns += ", " + related_shape.columns
        source += (f" JOIN {quote(related_meta.db_table)} ON {quote(related_meta.db_table)}."
                   f"{quote(foreign_key.target_field.column)} = {quote(meta.db_table)}.{quote(foreign_key.column)}")
    conditions, params = [], []
    for name, value in equal.items():
        field = meta.pk if name == "pk" else meta.get_field(name)
        if field.is_relation and not isinstance(value, int | str):
            value = value.pk
        elif not field.is_relation:
            value = field.to_python(value)
        conditions.append(f"{quote(meta.db_table)}.{quote(field.column)} = %s")
        params.append(field.get_db_prep_value(value, conn, prepared=False)
                      if not field.is_relation else field.target_field.get_db_prep_value(value, conn))
    sql = f"SELECT {columns} FROM {source} WHERE {' AND '.join(conditions)} LIMIT 1"  # noqa: S608
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    width = len(shape.attnames)
    instance = _instance(conn, model, shape, list(row[:width]))
    if related is not None:
        foreign_key.set_cached_value(instance, _instance(conn, related, related_shape, list(row[width:])))
    return instance


def tenant_scalar(model, column: str, tenant_id: int, *, order_by_id_desc: bool = False):
    """`SELECT <column> FROM <model's table> WHERE tenant_id = %s [ORDER BY id DESC] LIMIT 1`, or None."""
    conn = this_connection()
    quote = conn.ops.quote_name
    meta = model._meta
    order = f" ORDER BY {quote(meta.pk.column)} DESC" if order_by_id_desc else ""
    sql = (f"SELECT {quote(meta.get_field(column).column)} FROM {quote(meta.db_table)} "  # noqa: S608
           f"WHERE {quote(meta.get_field('tenant').column)} = %s{order} LIMIT 1")
    with conn.cursor() as cursor:
        cursor.execute(sql, [tenant_id])
        row = cursor.fetchone()
    return row[0] if row else None


_statements: dict[tuple, tuple[str, list]] = {}  # (vendor, model, field names) → (INSERT text, fields)


def _insert_statement(conn, model, names: tuple[str, ...]) -> tuple[str, list]:
    key = (conn.vendor, model, names)
    found = _statements.get(key)
    if found is None:
        quote = conn.ops.quote_name
        meta = model._meta
        fields = [meta.get_field(name) for name in names]
        sql = (f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "  # noqa: S608
               f"VALUES ({', '.join(['%s'] * len(fields))}) RETURNING {quote(meta.pk.column)}")
        found = _statements[key] = (sql, fields)
    return found


def insert_row(model, **values) -> int:
    """INSERT one row of `model` (values by field name, prepared as the ORM prepares them); returns its id.

    No save machinery: no signals, no field defaults. For append-only rows (call events, audit
    events) written several times per call, where building and compiling an ORM insert costs more
    than the statement itself.
    """
    conn = this_connection()
    sql, fields = _insert_statement(conn, model, tuple(values))
    params = [field.get_db_prep_save(value, conn) for field, value in zip(fields, values.values(), strict=True)]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def insert_instance(instance) -> None:
    """INSERT a new instance's row as `save(force_insert=True)` would (its defaults were set when it was
    made; `auto_now_add` fields are filled here), without the save machinery: no signals. For a model that
    nothing listens to, on a hot path."""
    values = {field.name: field.pre_save(instance, add=True) for field in instance._meta.concrete_fields}
    insert_row(type(instance), **values)
    instance._state.adding = False
    instance._state.db = DEFAULT_DB_ALIAS


def tables_exist(*models) -> bool:
    """Whether the models' tables exist (after `migrate … zero` they do not; post-migrate hooks then do nothing)."""
    names = set(connection.introspection.table_names())
    return all(model._meta.db_table in names for model in models)
