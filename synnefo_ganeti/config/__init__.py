"""The control plane's settings: one TOML file plus ``SYNNEFO_GANETI__...`` environment overrides.

``Settings()`` reads the file that ``SYNNEFO_GANETI_CONFIG`` names (no file when it is
unset); ``Settings.from_file(path)`` reads the given one (the CLI's ``--config FILE``).
Sources, highest priority first: keyword arguments, the environment, the file. In the
environment, ``__`` separates the levels: ``SYNNEFO_GANETI__DATABASE__URL``,
``SYNNEFO_GANETI__RECONCILE__INTERVAL``; lists (``backends``) are given whole, as JSON.

.. code-block:: toml

    [database]
    url = "postgresql://sg@db.example.org/synnefo_ganeti"

    [[backends]]
    name = "athens"
    url = "https://ganeti-master.athens.example.org:5080"
    username = "synnefo"
    password_file = "athens.password"   # mode 0600; relative to this file's folder
    ca_file = "athens-rapi.pem"         # or fingerprint = "6B:5D:...", or insecure = true
    queue_dir = "/var/lib/ganeti/queue" # optional: watch the job queue (on the master node)
    drained = false                     # true: take no new instances on this backend
    timeout = 120                       # optional: this backend's reconcile timeout

    [ownership]
    prefix = "sg-"                      # instances whose names start with it ...
    tag = "synnefo-ganeti:owned"        # ... and that carry this tag are ours ("" turns it off)
    unique_names = "global"             # or "backend": where a live instance's name is unique
    tag_namespace = "synnefo-ganeti:"   # tags under it are ours to store and compare

    [reconcile]
    interval = 300                      # seconds between reconcile passes
    timeout = 60                        # seconds per backend per pass

    [dispatcher]                        # the daemon (synnefo-ganeti dispatcher); all optional
    strategy = "credits"                # or "round_robin"
    node_placement = "pnode"            # or "opportunistic", "ganeti": who picks the node in a backend
    health_interval = 10                # seconds between health probes of each backend
    fail_after = 3                      # failed probes in a row: down (no new placements)
    recover_after = 2                   # good probes in a row: up again
    webhook = "https://ops.example.org/hooks/ganeti"   # POSTed each health change
    status_port = 9180                  # /metrics, /healthz, /readyz on status_host

    [repair]                            # repairs by policy (docs/operations.md); off: report only
    node_down_after = 120               # seconds a node is down before an incident opens
    allow = ["start", "failover"]       # of "start", "migrate", "failover" (a backend's repair_allow wins)
    fence_command = "/usr/local/sbin/fence {node}"   # makes a down node safe (powers it off)

    [notify]                            # the change-feed webhook and AMQP (docs/changes.md); optional
    url = "https://api.example.org/hooks/synnefo-ganeti"
    secret_file = "webhook.secret"      # mode 0600: the HMAC-SHA256 key of the signature header
    amqp_url_file = "amqp.url"          # mode 0600: "amqps://user:password@broker/vhost" (or amqp_url)
    amqp_exchange = "synnefo_ganeti.changes"   # durable topic exchange; keys "changes.<kind>"

    [web]                               # the operator console (docs/console.md); optional
    enabled = true                      # also on the dispatcher's status server
    users_file = "console.users"        # "name:role:$argon2id$..." per line

    [synnefo]                           # watch --eventd-compat, Synnefo's eventd (docs/eventd.md)
    eventd_compat = true                # `watch --config FILE` runs it without the flag
    amqp_url_file = "eventd-amqp.url"   # mode 0600; exchange = "ganeti", rapi_url = ..., ...

Every problem raises :class:`~synnefo_ganeti.errors.ConfigError`, one line per bad key:
``config file /etc/synnefo-ganeti.toml: backends.1.url: must start with https://...``.
No message and no ``repr`` shows a password, a password file's content, or a database
URL's password.

The package's modules: ``_sections`` (the section models), ``_settings`` (``Settings``),
``_loading`` (the file, the environment, what a reload changes), ``_errors`` (validation
errors in words), ``_secrets`` (password files), ``_notify`` (``[notify]``), ``_web`` (``[web]``)
and ``_synnefo`` (``[synnefo]``).
"""

from __future__ import annotations

from synnefo_ganeti.config._loading import (
    CONFIG_ENV_VAR,
    ENV_PREFIX,
    BackendChanges,
    diff_backends,
)
from synnefo_ganeti.config._notify import NotifySettings
from synnefo_ganeti.config._repair import REPAIRS, RepairSettings
from synnefo_ganeti.config._secrets import read_password_file
from synnefo_ganeti.config._sections import (
    DEFAULT_OWNERSHIP_TAG,
    BackendSettings,
    DatabaseSettings,
    DispatcherSettings,
    EventLoop,
    NodePlacement,
    OwnershipSettings,
    ReconcileSettings,
    Repair,
    Strategy,
)
from synnefo_ganeti.config._settings import Settings
from synnefo_ganeti.config._synnefo import SynnefoSettings
from synnefo_ganeti.config._web import WebSettings

__all__ = [
    "CONFIG_ENV_VAR",
    "DEFAULT_OWNERSHIP_TAG",
    "ENV_PREFIX",
    "REPAIRS",
    "BackendChanges",
    "BackendSettings",
    "DatabaseSettings",
    "DispatcherSettings",
    "EventLoop",
    "NodePlacement",
    "NotifySettings",
    "OwnershipSettings",
    "ReconcileSettings",
    "Repair",
    "RepairSettings",
    "Settings",
    "Strategy",
    "SynnefoSettings",
    "WebSettings",
    "diff_backends",
    "read_password_file",
]
