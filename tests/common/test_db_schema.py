"""Two processes starting together on an empty database (an engine and its standby) race to
create the schema; the loser must start anyway. Real SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from epu.common.db import create_schema, make_engine
from sqlalchemy import Column, Integer, MetaData, Table, event, inspect
from sqlalchemy.exc import DBAPIError


def schema() -> MetaData:
    md = MetaData()
    Table("epu_race_a", md, Column("id", Integer, primary_key=True))
    Table("epu_race_b", md, Column("id", Integer, primary_key=True))
    return md


@pytest.fixture(params=["sqlite", "postgres"])
def url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'race.db'}"
    return request.getfixturevalue("pg_url")


def test_the_loser_of_a_create_race_finds_the_tables_and_starts(url: str) -> None:
    ours, theirs = make_engine(url), make_engine(url)
    md = schema()
    raced = []

    @event.listens_for(md, "before_create")
    def the_other_process_wins(target, connection, tables=(), **kw) -> None:
        # between our "does it exist?" (no) and our CREATE TABLE, the other process creates it
        if not raced:
            raced.append(True)
            schema().create_all(theirs)

    try:
        with pytest.raises(DBAPIError):  # what a single attempt does: the service would not start
            md.create_all(ours)
        raced.clear()
        for table in ("epu_race_a", "epu_race_b"):  # start again from an empty database
            with theirs.begin() as conn:
                conn.exec_driver_sql(f"DROP TABLE {table}")
        create_schema(ours, md)
        assert raced and {"epu_race_a", "epu_race_b"} <= set(inspect(ours).get_table_names())
    finally:
        ours.dispose()
        theirs.dispose()
