"""PostgreSQL as the suite uses it (ENGINE of toolkeeper.test_settings): Django's backend with a cheaper flush.

A test that commits (`transaction=True`) ends with a flush of every table. Django's is one TRUNCATE of all of them,
which gives each table and index new files: about a third of a second on an idle machine, paid by some 400 tests.
A test leaves a few hundred rows at most, and deleting them costs milliseconds. The end state is the same: every
foreign key is deferred (Django makes them so, and the flush defers any that are deferrable), so the order of the
deletes does not matter; a table whose TRUNCATE has triggers of its own is still truncated, last, so what its
triggers keep (a search statistics table) is emptied as Django's flush empties it.
"""
from django.db.backends.postgresql import base, operations

TABLES_WITH_TRUNCATE_TRIGGERS = """
SELECT DISTINCT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE NOT t.tgisinternal AND t.tgtype & 32 = 32 AND c.relnamespace = 'public'::regnamespace
"""


class DatabaseOperations(operations.DatabaseOperations):
    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if not tables or reset_sequences or allow_cascade:
            return super().sql_flush(style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        with self.connection.cursor() as cursor:
            cursor.execute(TABLES_WITH_TRUNCATE_TRIGGERS)
            truncated = {row[0] for row in cursor.fetchall()} & set(tables)
        statements = ["SET CONSTRAINTS ALL DEFERRED"]
        statements += [f"DELETE FROM {self.quote_name(table)}"  # noqa: S608 (the catalog's names, quoted)
                       for table in tables if table not in truncated]
        if truncated:
            statements.append("TRUNCATE " + ", ".join(self.quote_name(table) for table in sorted(truncated)))
        return statements


class DatabaseWrapper(base.DatabaseWrapper):
    ops_class = DatabaseOperations
