from __future__ import annotations

from synnefo_ganeti.cli import main

main()
