"""instances: an index of the names, whatever the status

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 07:00:00.000000

The only index of the instances by name was the partial unique one of the live rows
(``uq_instances_backend_id_name_live``, ``status <> 'DESTROYED'``), which a query may use only
when its own condition says as much, spelled the same way. Every other look by name read the
whole table: an instance by name whatever its status (``current_row``: the live row, else
the newest DESTROYED one), the DESTROYED rows of the names the reconciler finds orphaned
(19 ms a backend at 100,000 rows, a second of CPU a pass at 50 backends), and the name checks
across backends (``status != :status``, a bound value). This index serves them all: a name
is held by one row or a few.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_instances_name", "instances", ["name"])


def downgrade() -> None:
    op.drop_index("ix_instances_name", table_name="instances")
