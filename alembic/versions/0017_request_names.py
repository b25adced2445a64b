"""open requests found by name through an index

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-29 02:40:00.000000

- ``ix_requests_name_lower``: the requests by ``lower(name)``. Every new request and every
  placement checks that no open request holds its name; without this index each check read the
  whole ``requests`` table, which keeps every request ever made (issue 31: the check was the
  largest single cost of a burst in PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "ix_requests_name_lower"


def upgrade() -> None:
    op.create_index(_INDEX, "requests", [sa.text("lower(name)")])


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="requests")
