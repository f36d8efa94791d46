"""Small generic statements outside the ORM's usual path, for hot paths: single values of tenant-owned
rows (the tenant id always in the WHERE), one row found by equal fields, appending a row, and whether
tables exist yet. The statements particular to a call's path are in `tools.calls.statements`.
"""
import threading
import time
from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import DateTimeField


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


def fetch_one(model, *, join: str | tuple[str, ...] = (), tenant_values: tuple = (), **equal):
    """The row of `model` whose fields equal these values, as an instance (None when there is none), read
    with one plain statement instead of a compiled queryset; `join` names a foreign key whose row is loaded
    with it, as `select_related` would (several, to distinct tables: a tuple; a nullable one is LEFT JOINed).
    For lookups on a hot path (a request's API key and session, a worker's call), where building the
    queryset costs several times the statement. Values are prepared as the ORM prepares
    them: a malformed one raises ValidationError, ValueError or TypeError, as a queryset filter does.

    `tenant_values`: (model, field) pairs of one-row-per-tenant tables (configuration versions) read in the
    same statement for the found row's tenant, set on the instance as `tenant_values` {model: value}, with
    `tenant_values_read_at` (time.monotonic() just before the statement)."""
    conn = this_connection()
    quote = conn.ops.quote_name
    meta = model._meta
    shape = _shape(conn, model)
    columns, source = shape.columns, quote(meta.db_table)
    joins = []  # (foreign key, related model, its shape)
    for name in (join,) if isinstance(join, str) else join:
        foreign_key = meta.get_field(name)
        related = foreign_key.related_model
        related_shape = _shape(conn, related)
        related_table = quote(related._meta.db_table)
        columns += ", " + related_shape.columns
        kind = "LEFT JOIN" if foreign_key.null else "JOIN"
        source += (f" {kind} {related_table} ON {related_table}.{quote(foreign_key.target_field.column)} = "
                   f"{quote(meta.db_table)}.{quote(foreign_key.column)}")
        joins.append((foreign_key, related, related_shape))
    tenant_column = f"{quote(meta.db_table)}.{quote(meta.get_field('tenant').column)}" if tenant_values else ""
    for other, name in tenant_values:
        other_meta = other._meta
        columns += (f", (SELECT {quote(other_meta.get_field(name).column)} FROM {quote(other_meta.db_table)} "  # noqa: S608
                    f"WHERE {quote(other_meta.get_field('tenant').column)} = {tenant_column})")
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
    read_at = time.monotonic()
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    width = len(shape.attnames)
    instance = _instance(conn, model, shape, list(row[:width]))
    for foreign_key, related, related_shape in joins:
        values = list(row[width:width + len(related_shape.attnames)])
        width += len(related_shape.attnames)
        found = None if getattr(instance, foreign_key.attname) is None else _instance(conn, related, related_shape,
                                                                                       values)
        foreign_key.set_cached_value(instance, found)
    if tenant_values:
        extra = row[width:]
        instance.tenant_values = {other: value for (other, _), value in zip(tenant_values, extra, strict=True)}
        instance.tenant_values_read_at = read_at
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


def _insert_statement(conn, model, names: tuple[str, ...], unless: tuple[str, ...] = ()) -> tuple[str, list]:
    key = (conn.vendor, model, names, unless)
    found = _statements.get(key)
    if found is None:
        quote = conn.ops.quote_name
        meta = model._meta
        fields = [meta.get_field(name) for name in names]
        skip = (f" ON CONFLICT ({', '.join(quote(meta.get_field(name).column) for name in unless)}) DO NOTHING"
                if unless else "")
        sql = (f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "  # noqa: S608
               f"VALUES ({', '.join(['%s'] * len(fields))}){skip} RETURNING {quote(meta.pk.column)}")
        found = _statements[key] = (sql, fields)
    return found


def insert_row(model, *, unless_taken: tuple[str, ...] = (), **values) -> int | None:
    """INSERT one row of `model` (values by field name, prepared as the ORM prepares them); returns its id.
    With `unless_taken` (the fields of a unique constraint), a row whose values there are taken is not
    written and None is returned, in the same statement, instead of an error that would end the transaction.

    No save machinery: no signals, no field defaults. For append-only rows (call events, audit
    events) written several times per call, where building and compiling an ORM insert costs more
    than the statement itself.
    """
    conn = this_connection()
    sql, fields = _insert_statement(conn, model, tuple(values), unless_taken)
    params = [field.get_db_prep_save(value, conn) for field, value in zip(fields, values.values(), strict=True)]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return row[0] if row else None


def insert_instance_statement(instance, *, unless_taken: tuple[str, ...] = (), now=None) -> tuple[str, list]:
    """The INSERT … RETURNING id that `insert_instance` runs for a new instance, with its parameters: for a
    caller that writes more rows in the same statement (then `instance_written` once it is written). `now`:
    the time its `auto_now`/`auto_now_add` fields take (the caller's reading of the clock, so that other times
    it set from the same reading agree with them); by default the clock is read here, as `save` does."""
    values = {}
    for field in instance._meta.concrete_fields:
        if now is not None and isinstance(field, DateTimeField) and (field.auto_now or field.auto_now_add):
            setattr(instance, field.attname, now)
            values[field.name] = now
        else:
            values[field.name] = field.pre_save(instance, add=True)
    conn = this_connection()
    sql, fields = _insert_statement(conn, type(instance), tuple(values), unless_taken)
    return sql, [field.get_db_prep_save(value, conn) for field, value in zip(fields, values.values(), strict=True)]


def instance_written(instance) -> None:
    """Mark an instance inserted outside the ORM as a saved one."""
    instance._state.adding = False
    instance._state.db = DEFAULT_DB_ALIAS


def insert_instance(instance, *, unless_taken: tuple[str, ...] = (), now=None) -> bool:
    """INSERT a new instance's row as `save(force_insert=True)` would (its defaults were set when it was
    made; `auto_now_add` fields are filled here), without the save machinery: no signals. For a model that
    nothing listens to, on a hot path. With `unless_taken`, as `insert_row`: False when not written; `now` as
    in `insert_instance_statement`."""
    sql, params = insert_instance_statement(instance, unless_taken=unless_taken, now=now)
    with this_connection().cursor() as cursor:
        cursor.execute(sql, params)
        if cursor.fetchone() is None:
            return False
    instance_written(instance)
    return True


def tables_exist(*models) -> bool:
    """Whether the models' tables exist (after `migrate … zero` they do not; post-migrate hooks then do nothing)."""
    names = set(connection.introspection.table_names())
    return all(model._meta.db_table in names for model in models)
