"""Querysets compiled once: a hot query's SQL, built by the ORM the first time and reused.

Django compiles a queryset to SQL each time it is evaluated. For the few queries every engine tick
runs (the session under its lock with its agent, the turn, the turn's latest steps) that compiling
was 15-20 % of a model gateway's CPU (py-spy --gil, bench/concurrency.py N = 300). A ``Prepared``
holds a function that builds the queryset from keyword parameters. The first call on a database
builds and compiles it twice, with two sets of stand-in values, and records which statement
parameters are which keyword (the positions where the two compilations differ; every other
parameter is a constant of the query). Later calls run that SQL with the new values and build the
model instances as Django's ``ModelIterable`` does (``from_db``, the ``select_related``
populators, the field converters).

PostgreSQL only, whose driver takes UUIDs, ints and strings as they are, and non-empty lists of them
for ``field__any=values`` (``AnyOf``: one array parameter, so the statement does not change with the
number of values); on other databases, and for a value of another type (None, a bool, an empty
list), the queryset is built and evaluated as usual.

``all_together`` runs several prepared querysets in one round trip (psycopg's pipeline mode): what
a live event batch shows is read at once, not in one wait on the server per table.
"""

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import Field, ForeignObject, Lookup, Model, QuerySet
from django.db.models.query import ModelIterable, get_related_populators
from django.db.transaction import TransactionManagementError

M = TypeVar("M", bound=Model)
SUPPORTED = (uuid.UUID, int, str)


@Field.register_lookup
class AnyOf(Lookup):
    """``field__any=[a, b, …]``: the field equals one of the values. On PostgreSQL
    ``field = ANY(%s)`` with the values as one array parameter: the same statement for any number
    of values, so ``Prepared`` compiles it once and the server prepares it once. Elsewhere
    ``IN (%s, …)``, as ``__in``."""

    lookup_name = "any"
    prepare_rhs = False

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        field = self.lhs.output_field
        values = [field.get_db_prep_value(field.get_prep_value(v), connection, prepared=True) for v in self.rhs]
        if connection.vendor == "postgresql":
            return f"{lhs} = ANY(%s)", (*lhs_params, values)
        if not values:
            raise EmptyResultSet
        return f"{lhs} IN ({', '.join(['%s'] * len(values))})", (*lhs_params, *values)


ForeignObject.register_lookup(AnyOf)  # a foreign key's own lookups are its class's, not Field's


def _supported(value: Any) -> bool:
    if isinstance(value, list):
        return bool(value) and all(_supported(v) and not isinstance(v, list) for v in value)
    return isinstance(value, SUPPORTED) and not isinstance(value, bool)


def _stand_in(value: Any) -> Any:
    if isinstance(value, list):
        return [_stand_in(value[0])]
    if isinstance(value, uuid.UUID):
        return uuid.uuid4()
    if isinstance(value, int):
        return random.randint(1_000_000_007, 2_000_000_000)
    return f"prepared-{uuid.uuid4().hex}"


@dataclass
class _Compiled:
    sql: str
    slots: list[tuple[bool, Any]]  # per statement parameter: (True, keyword) or (False, constant)
    model: type[Model]
    start: int
    end: int
    init_list: list[str]
    populators: list[Any]
    annotations: dict[str, int]
    converters: list[tuple[int, tuple[list[Any], Any]]]
    for_update: bool


class Prepared(Generic[M]):
    """``Prepared(lambda pk: Model.objects.filter(pk=pk)).all(pk=value)``: see the module docstring."""

    def __init__(self, build: Callable[..., "QuerySet[M]"]) -> None:
        self.build = build
        self._compiled: dict[str, _Compiled] = {}

    def all(self, **values: Any) -> list[M]:
        statement = self._statement(values)
        if isinstance(statement, list):
            return statement
        compiled, connection, params = statement
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, params)
            rows = cursor.fetchall()
        return self._instances(compiled, connection, rows)

    def _statement(self, values: dict[str, Any]) -> "list[M] | tuple[_Compiled, Any, list[Any]]":
        """What to run for these values (the compiled SQL, its connection and parameters), or,
        where it cannot be prepared, the rows themselves, read as Django reads them."""
        if not all(_supported(v) for v in values.values()):
            return list(self.build(**values))
        probe = None
        alias = next(iter(self._compiled), None)
        if alias is None:
            probe = self.build(**values)
            alias = probe.db
        connection = connections[alias]
        if connection.vendor != "postgresql":
            return list(probe if probe is not None else self.build(**values))
        compiled = self._compiled.get(alias) or self._compile(alias, values)
        if compiled.for_update and not connection.in_atomic_block:
            raise TransactionManagementError("select_for_update cannot be used outside of a transaction.")
        return compiled, connection, [values[x] if is_value else x for is_value, x in compiled.slots]

    def first(self, **values: Any) -> M | None:
        rows = self.all(**values)
        return rows[0] if rows else None

    def _compile(self, alias: str, values: dict[str, Any]) -> _Compiled:
        first = {k: _stand_in(v) for k, v in values.items()}
        second = {k: _stand_in(v) for k, v in values.items()}
        compiled = []
        for stand_ins in (first, second):
            queryset = self.build(**stand_ins)
            extras = (getattr(queryset, "_prefetch_related_lookups", ()),
                      getattr(queryset, "_known_related_objects", {}))
            if queryset._iterable_class is not ModelIterable or any(extras):
                raise TypeError("Prepared takes plain model querysets (no values(), prefetch or known objects)")
            compiler = queryset.query.get_compiler(using=alias)
            sql, params = compiler.as_sql()
            if compiler.has_extra_select:
                raise TypeError("Prepared takes no extra select columns")
            compiled.append((queryset, compiler, sql, list(params)))
        (queryset, compiler, sql, params), (_, _, sql2, params2) = compiled
        if sql != sql2 or len(params) != len(params2):
            raise TypeError("the query's shape depends on its values: it cannot be prepared")
        slots: list[tuple[bool, Any]] = []
        for a, b in zip(params, params2, strict=True):
            if a == b:
                slots.append((False, a))
                continue
            names = [k for k in values if first[k] == a and second[k] == b]
            if len(names) != 1:
                raise TypeError(f"a parameter of the query is not one of {sorted(values)} as given")
            slots.append((True, names[0]))
        missing = set(values) - {x for is_value, x in slots if is_value}
        if missing:
            raise TypeError(f"{sorted(missing)} do not reach the query's parameters as given")
        fields = [s[0] for s in compiler.select[0:compiler.col_count]]
        klass_info, select = compiler.klass_info, compiler.select
        start, end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
        result = _Compiled(sql=sql, slots=slots, model=klass_info["model"], start=start, end=end,
                           init_list=[f[0].target.attname for f in select[start:end]],
                           populators=get_related_populators(klass_info, select, alias),  # type: ignore[call-arg]
                           annotations=dict(compiler.annotation_col_map or {}),
                           converters=list(compiler.get_converters(fields).items()),
                           for_update=bool(queryset.query.select_for_update))
        self._compiled[alias] = result
        return result

    @staticmethod
    def _instances(compiled: _Compiled, connection: Any, rows: list[Any]) -> list[M]:
        out = []
        start, end, alias = compiled.start, compiled.end, connection.alias
        for row in rows:
            if compiled.converters:  # as SQLCompiler.apply_converters, with this thread's connection
                row = list(row)
                for pos, (converters, expression) in compiled.converters:
                    value = row[pos]
                    for converter in converters:
                        value = converter(value, expression, connection)
                    row[pos] = value
            obj = compiled.model.from_db(alias, compiled.init_list, row[start:end])
            for populator in compiled.populators:
                populator.populate(row, obj)
            for name, pos in compiled.annotations.items():
                setattr(obj, name, row[pos])
            out.append(obj)
        return out  # type: ignore[return-value]


def all_together(*reads: tuple[Prepared[Any], dict[str, Any]]) -> list[list[Any]]:
    """``[p.all(**values) for p, values in reads]``, in one round trip to PostgreSQL: the
    statements go out together in psycopg's pipeline mode and their rows come back together.
    A read that cannot be prepared (another database, values of another type) runs on its own."""
    results: list[list[Any] | None] = [None] * len(reads)
    pending: list[tuple[int, _Compiled, Any, list[Any]]] = []
    for n, (prepared, values) in enumerate(reads):
        statement = prepared._statement(values)
        if isinstance(statement, list):
            results[n] = statement
        else:
            pending.append((n, *statement))
    if len(pending) == 1:
        n, compiled, connection, params = pending[0]
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, params)
            results[n] = Prepared._instances(compiled, connection, cursor.fetchall())
    elif pending:
        connection = pending[0][2]
        assert all(c is connection for _, _, c, _ in pending), "one database per call"
        connection.ensure_connection()
        cursors = [connection.cursor() for _ in pending]
        try:
            with connection.wrap_database_errors:
                with connection.connection.pipeline():
                    for cursor, (_, compiled, _, params) in zip(cursors, pending, strict=True):
                        cursor.execute(compiled.sql, params)
                for cursor, (n, compiled, _, _) in zip(cursors, pending, strict=True):
                    results[n] = Prepared._instances(compiled, connection, cursor.fetchall())
        finally:
            for cursor in cursors:
                cursor.close()
    return [rows if rows is not None else [] for rows in results]
