#!/usr/bin/env python3
"""Write synnefo_ganeti/testing/data/opcodes.json from Ganeti 3.0's own opcodes module.

Run with Ganeti's Python (the testbed's packages)::

    PYTHONPATH=/usr/share/ganeti/3.0 /usr/bin/python3 scripts/gen-fake-opcodes.py \
        > synnefo_ganeti/testing/data/opcodes.json

For every opcode: its parameters in ``GetAllParams()`` order (the order a job file's
resolved input has them), each ``[name, default]`` (``null`` when it has none), and the
field its summary names (``OP_DSC_FIELD``).
"""

from __future__ import annotations

import json
import sys

from ganeti import ht, opcodes  # type: ignore[import-not-found]

GENERIC = ("dry_run", "debug_level", "priority", "depends", "comment", "reason")
out = {}
for cls in sorted(opcodes.OP_MAPPING.values(), key=lambda c: c.OP_ID):
    params = []
    for name, default, _check, _doc in cls.GetAllParams():
        if name in GENERIC:
            continue
        if default is ht.NoDefault or callable(default):
            default = None
        params.append([name, default])
    out[cls.OP_ID] = {"params": params, "summary": getattr(cls, "OP_DSC_FIELD", None)}
json.dump(out, sys.stdout, indent=None, separators=(",", ":"), sort_keys=True)
sys.stdout.write("\n")
