"""Exact text comparison in SQL, identical on every dialect.

A substring test is ``instr`` on SQLite, ``strpos`` on PostgreSQL and a binary ``INSTR`` on
MariaDB/MySQL. ``LIKE`` would need wildcard escaping and, under MariaDB's default case- and
accent-insensitive, pad-space collations, would select different rows there than elsewhere;
so would a plain ``=``.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement


class _Position(FunctionElement[int]):
    """1-based position of ``needle`` in ``haystack``, 0 when absent (NULL for a NULL haystack)."""

    type = sa.Integer()
    inherit_cache = True
    name = "clawmem_position"


@compiles(_Position)
def _position_instr(element: _Position, compiler: Any, **kw: Any) -> str:
    haystack, needle = (compiler.process(clause, **kw) for clause in element.clauses)
    return f"instr({haystack}, {needle})"


@compiles(_Position, "postgresql")
def _position_strpos(element: _Position, compiler: Any, **kw: Any) -> str:
    haystack, needle = (compiler.process(clause, **kw) for clause in element.clauses)
    return f"strpos({haystack}, {needle})"


class _Exact(FunctionElement[Any]):
    """A text expression compared byte for byte: MariaDB/MySQL collations otherwise ignore case,
    accents and trailing spaces. Elsewhere text already compares exactly."""

    inherit_cache = True
    name = "clawmem_exact"


@compiles(_Exact)
def _exact_default(element: _Exact, compiler: Any, **kw: Any) -> str:
    (text,) = element.clauses
    return str(compiler.process(text, **kw))


@compiles(_Exact, "mysql")
@compiles(_Exact, "mariadb")
def _exact_mysql(element: _Exact, compiler: Any, **kw: Any) -> str:
    # A substring match on UTF-8 bytes is a substring match on characters.
    (text,) = element.clauses
    return f"CAST({compiler.process(text, **kw)} AS BINARY)"


def contains(column: sa.ColumnElement[Any], text: str) -> sa.ColumnElement[bool]:
    """Return the condition "``column`` contains ``text``" (exact, case-sensitive, no wildcards)."""
    return _Position(_Exact(column), _Exact(sa.literal(text, sa.Text()))) > 0


def equals_exactly(column: sa.ColumnElement[Any], value: str) -> sa.ColumnElement[bool]:
    """Return the condition "``column`` equals ``value``" compared exactly on every dialect.

    The plain comparison lets an index find the candidates; the exact one decides.
    """
    return sa.and_(column == value, _Exact(column) == _Exact(sa.literal(value, sa.String())))
