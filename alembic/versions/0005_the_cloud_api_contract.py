"""the cloud-API contract: instance UUIDs, tasks and last errors, what Ganeti made, the change feed

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26 15:40:00.000000

Instances get a public ``uuid`` (existing rows one each), ``task``/``task_job_id``,
``last_error``, and the ``memory``/``vcpus``/``pnode`` Ganeti reports; requests the
``instance_uuid`` of the row they placed. A name is unique on its backend only among
the rows not DESTROYED (a partial unique index in place of ``uq_instances_backend_id``):
a reused name gets a new row, the DESTROYED one stays findable by its id. ``changes`` is the change feed, written by
triggers (so that every process's writes are in it: the API's, the CLI's, the
dispatcher's) in commit order: on PostgreSQL the trigger takes the writers' advisory lock
(the one every writer holds already) and NOTIFYs ``synnefo_ganeti_changes`` with the id.
``feed_cursors`` keeps how far a consumer (the webhook) got.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

#: the writers' advisory lock key ("sgwr"; synnefo_ganeti.store.db._engine._WRITE_LOCK_KEY)
_WRITE_LOCK_KEY = 1936160626
CHANGES_CHANNEL = "synnefo_ganeti_changes"

#: a name is unique on its backend among the rows not DESTROYED (DESTROYED rows stay, findable by id)
_LIVE_NAMES = "uq_instances_backend_id_name_live"
_LIVE = "status <> 'DESTROYED'"

_SQLITE_NOW = "(julianday('now') - 2440587.5) * 86400.0"
_SQLITE_REQUEST = (
    "INSERT INTO changes (kind, key, status, task, error, at) "
    f"VALUES ('request', NEW.id, NEW.status, NULL, NEW.error, {_SQLITE_NOW});"
)
_SQLITE_INSTANCE = (
    "INSERT INTO changes (kind, key, status, task, error, at) "
    "VALUES ('instance', NEW.uuid, NEW.status, NEW.task, "
    f"json_extract(NEW.last_error, '$.message'), {_SQLITE_NOW});"
)
_SQLITE_TRIGGERS = [
    f"CREATE TRIGGER changes_requests_insert AFTER INSERT ON requests BEGIN {_SQLITE_REQUEST} END",
    "CREATE TRIGGER changes_requests_update AFTER UPDATE OF status, error ON requests "
    "WHEN OLD.status IS NOT NEW.status OR OLD.error IS NOT NEW.error "
    f"BEGIN {_SQLITE_REQUEST} END",
    f"CREATE TRIGGER changes_instances_insert AFTER INSERT ON instances BEGIN {_SQLITE_INSTANCE} END",
    "CREATE TRIGGER changes_instances_update AFTER UPDATE OF status, task, last_error ON instances "
    "WHEN OLD.status IS NOT NEW.status OR OLD.task IS NOT NEW.task "
    "OR OLD.last_error IS NOT NEW.last_error "
    f"BEGIN {_SQLITE_INSTANCE} END",
]

_PG_FUNCTION = f"""
CREATE FUNCTION synnefo_ganeti_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    change_id bigint;
BEGIN
    -- commit order = id order: every writer holds this lock already (re-entrant)
    PERFORM pg_advisory_xact_lock(hashtext(current_database()), {_WRITE_LOCK_KEY});
    IF TG_TABLE_NAME = 'requests' THEN
        INSERT INTO changes (kind, key, status, task, error, at)
        VALUES ('request', NEW.id, NEW.status, NULL, NEW.error, extract(epoch FROM clock_timestamp()))
        RETURNING id INTO change_id;
    ELSE
        INSERT INTO changes (kind, key, status, task, error, at)
        VALUES ('instance', NEW.uuid, NEW.status, NEW.task, NEW.last_error ->> 'message',
                extract(epoch FROM clock_timestamp()))
        RETURNING id INTO change_id;
    END IF;
    PERFORM pg_notify('{CHANGES_CHANNEL}', change_id::text);
    RETURN NULL;
END
$$
"""
_PG_TRIGGERS = [
    "CREATE TRIGGER changes_requests_insert AFTER INSERT ON requests "
    "FOR EACH ROW EXECUTE FUNCTION synnefo_ganeti_change()",
    "CREATE TRIGGER changes_requests_update AFTER UPDATE OF status, error ON requests FOR EACH ROW "
    "WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.error IS DISTINCT FROM NEW.error) "
    "EXECUTE FUNCTION synnefo_ganeti_change()",
    "CREATE TRIGGER changes_instances_insert AFTER INSERT ON instances "
    "FOR EACH ROW EXECUTE FUNCTION synnefo_ganeti_change()",
    "CREATE TRIGGER changes_instances_update AFTER UPDATE OF status, task, last_error ON instances "
    "FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.task IS DISTINCT FROM NEW.task "
    "OR OLD.last_error::text IS DISTINCT FROM NEW.last_error::text) "
    "EXECUTE FUNCTION synnefo_ganeti_change()",
]
_TRIGGER_TABLES = {
    "changes_requests_insert": "requests",
    "changes_requests_update": "requests",
    "changes_instances_insert": "instances",
    "changes_instances_update": "instances",
}


def upgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("uuid", sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column("task", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("task_job_id", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("last_error", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("memory", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("vcpus", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("pnode", sa.String(length=255), nullable=True))
    connection = op.get_bind()
    instances = sa.table("instances", sa.column("id", sa.Integer()), sa.column("uuid", sa.String()))
    for (row_id,) in connection.execute(sa.select(instances.c.id)).all():
        connection.execute(
            sa.update(instances).where(instances.c.id == row_id).values(uuid=str(uuid.uuid4()))
        )
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.alter_column("uuid", existing_type=sa.String(length=36), nullable=False)
        batch_op.create_unique_constraint(batch_op.f("uq_instances_uuid"), ["uuid"])
        batch_op.drop_constraint("uq_instances_backend_id", type_="unique")
    # (after the batch: SQLite's copy of the table would not keep the index's WHERE)
    op.create_index(
        _LIVE_NAMES,
        "instances",
        ["backend_id", "name"],
        unique=True,
        postgresql_where=sa.text(_LIVE),
        sqlite_where=sa.text(_LIVE),
    )

    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("instance_uuid", sa.String(length=36), nullable=True))

    op.create_table(
        "changes",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=True),
        sa.Column("task", sa.String(length=16), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_changes")),
    )
    op.create_table(
        "feed_cursors",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("last_id", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_feed_cursors")),
    )

    if connection.dialect.name == "postgresql":
        op.execute(_PG_FUNCTION)
        for statement in _PG_TRIGGERS:
            op.execute(statement)
    else:
        for statement in _SQLITE_TRIGGERS:
            op.execute(statement)


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for trigger, table in _TRIGGER_TABLES.items():
        op.execute(f"DROP TRIGGER IF EXISTS {trigger}" + (f" ON {table}" if postgresql else ""))
    if postgresql:
        op.execute("DROP FUNCTION IF EXISTS synnefo_ganeti_change()")
    op.drop_table("feed_cursors")
    op.drop_table("changes")
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("instance_uuid")
    op.drop_index(_LIVE_NAMES, table_name="instances")
    # one row per (backend, name) again: the live one, else the most recent
    op.execute(
        "DELETE FROM instances WHERE status = 'DESTROYED' AND EXISTS (SELECT 1 FROM instances AS other "
        "WHERE other.backend_id = instances.backend_id AND other.name = instances.name "
        "AND (other.status <> 'DESTROYED' OR other.id > instances.id))"
    )
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.create_unique_constraint("uq_instances_backend_id", ["backend_id", "name"])
        batch_op.drop_constraint(batch_op.f("uq_instances_uuid"), type_="unique")
        batch_op.drop_column("pnode")
        batch_op.drop_column("vcpus")
        batch_op.drop_column("memory")
        batch_op.drop_column("last_error")
        batch_op.drop_column("task_job_id")
        batch_op.drop_column("task")
        batch_op.drop_column("uuid")
