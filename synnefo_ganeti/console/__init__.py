"""The operator console: pages in the browser over the control plane, live, behind a login.

``synnefo-ganeti web --config FILE`` serves it (``[web]`` in the config file); with
``[web] enabled = true`` the dispatcher's status server serves it too; ``synnefo-ganeti
demo --web`` keeps the demo's world running with it open. See docs/console.md.

The modules, one job each: ``_app`` (the aiohttp application, login, the event stream),
``_auth`` (users and tokens files, sessions, roles, CSRF), ``_live`` (one store reader
per process fanned out to every open page), ``_data`` (what the pages show: node stats,
reconcile reports, the overview's figures), ``_views`` (the pages and their live
fragments), ``_actions`` (what an operator can do); ``templates/`` and ``static/`` (htmx,
shipped with its license, the styles and the page script).
"""

from __future__ import annotations

from synnefo_ganeti.console._app import Console
from synnefo_ganeti.console._auth import ROLES, Role, User, hash_password, hash_token, read_users
from synnefo_ganeti.console._data import Reports

__all__ = ["ROLES", "Console", "Reports", "Role", "User", "hash_password", "hash_token", "read_users"]
