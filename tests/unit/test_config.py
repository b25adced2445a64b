from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import SecretStr

from synnefo_ganeti.config import (
    BackendSettings,
    DatabaseSettings,
    OwnershipSettings,
    ReconcileSettings,
    Settings,
    diff_backends,
    read_password_file,
)
from synnefo_ganeti.errors import ConfigError
from synnefo_ganeti.rapi import RapiClient

FINGERPRINT = "6B:5D:F2:" + ":".join(["AB"] * 29)

FULL = """\
[database]
url = "postgresql://sg:db-secret@db.example.org/synnefo_ganeti"

[[backends]]
name = "athens"
url = "https://ganeti.athens.example.org:5080/"
username = "synnefo"
password_file = "athens.password"
ca_file = "athens-rapi.pem"
queue_dir = "queue"
timeout = 120

[[backends]]
name = "patras"
url = "https://ganeti.patras.example.org:5080"
username = "synnefo"
password = "patras-secret"
fingerprint = "{fingerprint}"
drained = true
max_connections = 5

[ownership]
prefix = "sg-"
tag = "synnefo-ganeti:owned"

[reconcile]
interval = 120
timeout = 30
"""

MINIMAL_BACKEND = """\
[[backends]]
name = "a"
url = "https://ganeti.example.org:5080"
username = "synnefo"
password = "a-secret"
"""


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("SYNNEFO_GANETI_"):
            monkeypatch.delenv(name)


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture
def full_config(tmp_path: Path) -> Path:
    write(tmp_path / "athens.password", "athens-secret\n", 0o600)
    write(tmp_path / "athens-rapi.pem", "-----BEGIN CERTIFICATE-----\n")
    return write(tmp_path / "sg.toml", FULL.format(fingerprint=FINGERPRINT))


def config_error(path: Path, text: str) -> str:
    write(path, text)
    with pytest.raises(ConfigError) as info:
        Settings.from_file(path)
    return str(info.value)


# -- a valid file ---------------------------------------------------------------------------------------


def test_full_file(full_config: Path, tmp_path: Path) -> None:
    settings = Settings.from_file(full_config)

    assert settings.source == full_config
    assert settings.database.url == "postgresql://sg:db-secret@db.example.org/synnefo_ganeti"
    athens, patras = settings.backends
    assert athens.name == "athens"
    assert athens.url == "https://ganeti.athens.example.org:5080"  # trailing slash dropped
    assert athens.username == "synnefo"
    # relative paths are taken from the config file's folder
    assert athens.password_file == tmp_path / "athens.password"
    assert athens.ca_file == tmp_path / "athens-rapi.pem"
    assert athens.queue_dir == tmp_path / "queue"
    assert isinstance(athens.password, SecretStr)
    assert athens.password.get_secret_value() == "athens-secret"  # trailing newline stripped
    assert athens.fingerprint is None and not athens.insecure and not athens.drained
    assert athens.timeout == 120
    assert patras.password is not None and patras.password.get_secret_value() == "patras-secret"
    assert patras.fingerprint == FINGERPRINT
    assert patras.drained and patras.max_connections == 5
    assert settings.ownership == OwnershipSettings(prefix="sg-", tag="synnefo-ganeti:owned")
    assert settings.reconcile == ReconcileSettings(interval=120, timeout=30)
    assert settings.backend("patras") is patras
    assert settings.reconcile_timeout(athens) == 120
    assert settings.reconcile_timeout("patras") == 30


def test_defaults_without_a_file() -> None:
    settings = Settings()
    assert settings.source is None
    assert settings.database == DatabaseSettings(url="sqlite:///synnefo-ganeti.db")
    assert settings.backends == []
    assert settings.ownership.tag == "synnefo-ganeti:owned" and settings.ownership.prefix is None
    assert settings.reconcile.interval == 300 and settings.reconcile.timeout == 60


def test_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    settings = Settings.from_file(write(tmp_path / "sg.toml", ""))
    assert settings.backends == [] and settings.database.url == "sqlite:///synnefo-ganeti.db"


def test_settings_reads_the_file_named_by_the_environment(
    full_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SYNNEFO_GANETI_CONFIG", str(full_config))
    settings = Settings()
    assert settings.source == full_config
    assert [b.name for b in settings.backends] == ["athens", "patras"]


def test_from_file_wins_over_the_environment_variable(
    full_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SYNNEFO_GANETI_CONFIG", str(tmp_path / "elsewhere.toml"))
    other = write(tmp_path / "other.toml", MINIMAL_BACKEND)
    assert [b.name for b in Settings.from_file(other).backends] == ["a"]


def test_relative_config_path_is_made_absolute(
    full_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = Settings.from_file("sg.toml")
    assert settings.source == full_config
    assert settings.backends[0].password_file == tmp_path / "athens.password"


# -- environment overrides ------------------------------------------------------------------------------


def test_environment_overrides_the_file(full_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYNNEFO_GANETI__DATABASE__URL", "sqlite:////var/lib/sg/sg.db")
    monkeypatch.setenv("SYNNEFO_GANETI__RECONCILE__INTERVAL", "15")
    settings = Settings.from_file(full_config)
    assert settings.database.url == "sqlite:////var/lib/sg/sg.db"
    assert settings.reconcile.interval == 15
    assert settings.reconcile.timeout == 30  # the rest of [reconcile] still comes from the file
    assert len(settings.backends) == 2


def test_environment_without_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYNNEFO_GANETI__RECONCILE__TIMEOUT", "5.5")
    monkeypatch.setenv("SYNNEFO_GANETI__OWNERSHIP__PREFIX", "sg-")
    settings = Settings()
    assert settings.reconcile.timeout == 5.5
    assert settings.ownership.prefix == "sg-"


def test_keyword_arguments_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYNNEFO_GANETI__RECONCILE__INTERVAL", "15")
    assert Settings(reconcile={"interval": 7}).reconcile.interval == 7


def test_bad_environment_value_names_the_variable(full_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYNNEFO_GANETI__RECONCILE__INTERVAL", "soon")
    with pytest.raises(ConfigError) as info:
        Settings.from_file(full_config)
    assert str(info.value).startswith(
        "environment variable SYNNEFO_GANETI__RECONCILE__INTERVAL: reconcile.interval: "
    )


def test_unparsable_environment_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYNNEFO_GANETI__BACKENDS", "athens")
    with pytest.raises(ConfigError, match=r"SYNNEFO_GANETI__BACKENDS: backends: .*JSON"):
        Settings()


def test_bad_database_url_in_the_environment_is_not_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYNNEFO_GANETI__DATABASE__URL", "mysql://sg:db-secret@db/sg")
    with pytest.raises(ConfigError) as info:
        Settings()
    message = str(info.value)
    assert "SYNNEFO_GANETI__DATABASE__URL: database.url: " in message
    assert "'mysql' is not supported" in message
    assert "db-secret" not in message


# -- file problems --------------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=f"config file {path} does not exist"):
        Settings.from_file(path)


def test_missing_file_named_by_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "nope.toml"
    monkeypatch.setenv("SYNNEFO_GANETI_CONFIG", str(path))
    with pytest.raises(ConfigError, match=f"config file {path} does not exist"):
        Settings()


def test_config_path_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"config file {tmp_path} is a directory"):
        Settings.from_file(tmp_path)


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "sg.toml"
    message = config_error(path, '[database]\nurl = "sqlite:///x.db"\ninterval 5\n')
    assert message.startswith(f"config file {path}: not valid TOML: ")
    assert "line 3" in message


def test_unknown_key(tmp_path: Path) -> None:
    path = tmp_path / "sg.toml"
    message = config_error(path, MINIMAL_BACKEND + 'pasword = "x"\n')
    assert message.startswith(
        f"config file {path}: backends.0.pasword: unknown key; did you mean 'password'?"
    )
    assert "x" not in message.split("unknown key")[0]


def test_unknown_table(tmp_path: Path) -> None:
    path = tmp_path / "sg.toml"
    message = config_error(path, "[reconciler]\ninterval = 5\n")
    assert message.startswith(f"config file {path}: reconciler: unknown key; did you mean 'reconcile'?")


def test_wrong_types(tmp_path: Path) -> None:
    path = tmp_path / "sg.toml"
    message = config_error(
        path,
        MINIMAL_BACKEND
        + 'timeout = "soon"\nmax_connections = 0\n[reconcile]\ninterval = "hourly"\ntimeout = -1\n',
    )
    lines = message.splitlines()
    assert all(line.startswith(f"config file {path}: ") for line in lines)
    keys = {line.split(": ")[1] for line in lines}
    assert keys == {
        "backends.0.timeout",
        "backends.0.max_connections",
        "reconcile.interval",
        "reconcile.timeout",
    }


def test_backends_must_be_an_array_of_tables(tmp_path: Path) -> None:
    path = tmp_path / "sg.toml"
    message = config_error(path, '[backends]\nname = "a"\n')
    assert message.startswith(f"config file {path}: backends: ")


def test_missing_required_keys(tmp_path: Path) -> None:
    path = tmp_path / "sg.toml"
    message = config_error(path, '[[backends]]\nname = "a"\n')
    assert f"config file {path}: backends.0.url: this key is required" in message
    assert f"config file {path}: backends.0.username: this key is required" in message


def test_neither_password_nor_password_file(tmp_path: Path) -> None:
    path = tmp_path / "sg.toml"
    message = config_error(path, '[[backends]]\nname = "a"\nurl = "https://h:5080"\nusername = "u"\n')
    assert (
        message
        == f"config file {path}: backends.0: give password_file (or password); ganeti-rapi requires authentication"
    )


def test_duplicate_backend_names(tmp_path: Path) -> None:
    path = tmp_path / "sg.toml"
    message = config_error(path, MINIMAL_BACKEND + MINIMAL_BACKEND.replace('"a"', '"b"') + MINIMAL_BACKEND)
    assert message == (
        f"config file {path}: backends: backend name 'a' is used twice (backends.0 and backends.2); "
        "names must be unique"
    )


@pytest.mark.parametrize("name", ["", "-a", "a b", "a/b"])
def test_bad_backend_names(tmp_path: Path, name: str) -> None:
    path = tmp_path / "sg.toml"
    message = config_error(path, MINIMAL_BACKEND.replace('"a"', f'"{name}"'))
    assert message.startswith(f"config file {path}: backends.0.name: ")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://h", "must start with https://"),
        ("h:5080", "must start with https://"),
        ("https://u:pw@h:5080", "must not carry credentials"),
        ("https://:5080", "no host name"),
        ("https://h:port", "not a valid URL"),
        ("https://h:5080/?x=1", "base URL"),
    ],
)
def test_bad_backend_urls(tmp_path: Path, url: str, problem: str) -> None:
    path = tmp_path / "sg.toml"
    message = config_error(path, MINIMAL_BACKEND.replace("https://ganeti.example.org:5080", url))
    assert message.startswith(f"config file {path}: backends.0.url: ")
    assert problem in message
    assert "pw" not in message


def test_plain_http_backend_is_allowed(tmp_path: Path) -> None:
    path = write(tmp_path / "sg.toml", MINIMAL_BACKEND.replace("https://", "http://"))
    assert Settings.from_file(path).backends[0].url == "http://ganeti.example.org:5080"


def test_unknown_backend(full_config: Path) -> None:
    settings = Settings.from_file(full_config)
    with pytest.raises(ConfigError) as info:
        settings.backend("sparta")
    assert (
        str(info.value) == f"unknown backend 'sparta'; the config file {full_config} defines: athens, patras"
    )
    with pytest.raises(ConfigError, match="unknown backend 'x'; the settings defines no backends"):
        Settings().backend("x")


# -- passwords ------------------------------------------------------------------------------------------


def backend_with(extra: str) -> str:
    return '[[backends]]\nname = "a"\nurl = "https://h:5080"\nusername = "u"\n' + extra


def test_password_and_password_file_together(tmp_path: Path) -> None:
    write(tmp_path / "pw", "secret\n", 0o600)
    path = tmp_path / "sg.toml"
    message = config_error(path, backend_with('password = "x"\npassword_file = "pw"\n'))
    assert message == f"config file {path}: backends.0: give either password or password_file, not both"


def test_world_readable_password_file_is_refused(tmp_path: Path) -> None:
    password_file = write(tmp_path / "pw", "very-secret\n", 0o644)
    path = tmp_path / "sg.toml"
    message = config_error(path, backend_with('password_file = "pw"\n'))
    assert message == (
        f"config file {path}: backends.0.password_file: password file {password_file} is readable by others "
        "(mode 0644); chmod 600 it"
    )
    assert "very-secret" not in message


def test_group_readable_password_file_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "pw", "very-secret\n", 0o640)
    message = config_error(tmp_path / "sg.toml", backend_with('password_file = "pw"\n'))
    assert "(mode 0640); chmod 600 it" in message


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_private_password_file_is_read(tmp_path: Path, mode: int) -> None:
    write(tmp_path / "pw", "very-secret\r\n", mode)
    path = write(tmp_path / "sg.toml", backend_with('password_file = "pw"\n'))
    backend = Settings.from_file(path).backends[0]
    assert backend.password is not None and backend.password.get_secret_value() == "very-secret"
    assert backend.password_value() == "very-secret"


def test_absolute_and_home_password_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    write(home / "pw", "from-home\n", 0o600)
    path = write(tmp_path / "sg.toml", backend_with('password_file = "~/pw"\n'))
    assert Settings.from_file(path).backends[0].password_value() == "from-home"
    path = write(tmp_path / "sg.toml", backend_with(f'password_file = "{home / "pw"}"\n'))
    assert Settings.from_file(path).backends[0].password_file == home / "pw"


def test_missing_password_file(tmp_path: Path) -> None:
    path = tmp_path / "sg.toml"
    message = config_error(path, backend_with('password_file = "pw"\n'))
    assert (
        message
        == f"config file {path}: backends.0.password_file: password file {tmp_path / 'pw'} does not exist"
    )


def test_password_file_that_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "pw").mkdir(mode=0o700)
    message = config_error(tmp_path / "sg.toml", backend_with('password_file = "pw"\n'))
    assert f"password file {tmp_path / 'pw'} is not a regular file" in message


def test_unreadable_password_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The tests run as root, which reads everything: simulate the refusal.
    password_file = write(tmp_path / "pw", "secret\n", 0o600)
    read_bytes = Path.read_bytes

    def refuse(self: Path) -> bytes:
        if self == password_file:
            raise PermissionError(13, "Permission denied", str(self))
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", refuse)
    message = config_error(tmp_path / "sg.toml", backend_with('password_file = "pw"\n'))
    assert message.endswith(
        f"backends.0.password_file: password file {password_file} cannot be read: Permission denied"
    )


def test_empty_password_file(tmp_path: Path) -> None:
    write(tmp_path / "pw", "\n", 0o600)
    message = config_error(tmp_path / "sg.toml", backend_with('password_file = "pw"\n'))
    assert message.endswith(f"password file {tmp_path / 'pw'} is empty")


def test_empty_password(tmp_path: Path) -> None:
    message = config_error(tmp_path / "sg.toml", backend_with('password = ""\n'))
    assert message.endswith("backends.0.password: the password is empty")


def test_password_of_the_wrong_type_is_not_echoed(tmp_path: Path) -> None:
    message = config_error(tmp_path / "sg.toml", backend_with("password = 918273645\n"))
    assert "backends.0.password: " in message
    assert "918273645" not in message


# -- TLS trust ------------------------------------------------------------------------------------------


def test_ca_file_and_fingerprint_together(tmp_path: Path) -> None:
    write(tmp_path / "rapi.pem", "-----BEGIN CERTIFICATE-----\n")
    path = tmp_path / "sg.toml"
    message = config_error(
        path, backend_with(f'password = "x"\nca_file = "rapi.pem"\nfingerprint = "{FINGERPRINT}"\n')
    )
    assert message == (
        f"config file {path}: backends.0: give only one of ca_file, fingerprint or insecure, "
        "not ca_file and fingerprint"
    )


def test_fingerprint_and_insecure_together(tmp_path: Path) -> None:
    message = config_error(
        tmp_path / "sg.toml",
        backend_with(f'password = "x"\nfingerprint = "{FINGERPRINT}"\ninsecure = true\n'),
    )
    assert message.endswith("not fingerprint and insecure")


def test_missing_ca_file(tmp_path: Path) -> None:
    path = tmp_path / "sg.toml"
    message = config_error(path, backend_with('password = "x"\nca_file = "rapi.pem"\n'))
    assert message.startswith(
        f"config file {path}: backends.0.ca_file: ca_file {tmp_path / 'rapi.pem'} does not exist"
    )


def test_bad_fingerprint(tmp_path: Path) -> None:
    message = config_error(tmp_path / "sg.toml", backend_with('password = "x"\nfingerprint = "abc"\n'))
    assert "backends.0.fingerprint: fingerprint 'abc' is not a SHA-256 digest" in message


def test_tls_options_need_https(tmp_path: Path) -> None:
    text = backend_with('password = "x"\ninsecure = true\n').replace("https://", "http://")
    message = config_error(tmp_path / "sg.toml", text)
    assert message.endswith("backends.0: insecure needs an https:// URL (ganeti-rapi serves HTTPS on :5080)")


# -- database -------------------------------------------------------------------------------------------


def test_bad_database_scheme(tmp_path: Path) -> None:
    path = tmp_path / "sg.toml"
    message = config_error(path, '[database]\nurl = "mysql://sg:db-secret@db/sg"\n')
    assert message.startswith(
        f"config file {path}: database.url: database URL scheme 'mysql' is not supported"
    )
    assert "db-secret" not in message


def test_unparsable_database_url(tmp_path: Path) -> None:
    message = config_error(tmp_path / "sg.toml", '[database]\nurl = "db-secret"\n')
    assert "database.url: the database URL is not a URL" in message
    assert "db-secret" not in message


@pytest.mark.parametrize(
    "url",
    ["sqlite:///sg.db", "sqlite+aiosqlite:////var/lib/sg.db", "postgresql://sg@db/sg", "postgres://db/sg"],
)
def test_supported_database_urls(url: str) -> None:
    assert DatabaseSettings(url=url).url == url


# -- no secrets in repr ---------------------------------------------------------------------------------


def test_repr_and_str_hold_no_secrets(full_config: Path) -> None:
    settings = Settings.from_file(full_config)
    for text in (repr(settings), str(settings), repr(settings.database), str(settings.database)):
        assert "db-secret" not in text
        assert "athens-secret" not in text
        assert "patras-secret" not in text
    assert "postgresql://sg:***@db.example.org/synnefo_ganeti" in repr(settings)
    assert settings.database.display_url == "postgresql://sg:***@db.example.org/synnefo_ganeti"
    for backend in settings.backends:
        assert "secret" not in repr(backend)


# -- ownership ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "tag", "name", "tags", "owned"),
    [
        (None, "sg:owned", "web1", ["sg:owned"], True),
        (None, "sg:owned", "web1", ["other"], False),
        (None, "sg:owned", "web1", [], False),
        ("sg-", None, "sg-web1", [], True),
        ("sg-", None, "web1", ["sg:owned"], False),
        ("sg-", "sg:owned", "sg-web1", ["x", "sg:owned"], True),
        ("sg-", "sg:owned", "sg-web1", ["x"], False),
        ("sg-", "sg:owned", "web1", ["sg:owned"], False),
        (None, None, "web1", ["sg:owned"], False),
    ],
)
def test_ownership(prefix: str | None, tag: str | None, name: str, tags: list[str], owned: bool) -> None:
    ownership = OwnershipSettings(prefix=prefix, tag=tag)
    assert ownership.owns(name, iter(tags)) is owned


def test_ownership_tags_for_new() -> None:
    assert OwnershipSettings().tags_for_new() == ["synnefo-ganeti:owned"]
    assert OwnershipSettings(prefix="sg-", tag=None).tags_for_new() == []


def test_empty_string_turns_a_marker_off(tmp_path: Path) -> None:
    path = write(tmp_path / "sg.toml", '[ownership]\nprefix = "sg-"\ntag = ""\n')
    ownership = Settings.from_file(path).ownership
    assert ownership.tag is None and ownership.prefix == "sg-"
    assert ownership.owns("sg-web1", [])


def test_bad_ownership_markers(tmp_path: Path) -> None:
    path = tmp_path / "sg.toml"
    message = config_error(path, '[ownership]\nprefix = "sg web"\ntag = "has space"\n')
    assert f"config file {path}: ownership.prefix: prefix 'sg web' cannot start an instance name" in message
    assert f"config file {path}: ownership.tag: tag 'has space' is not a Ganeti tag" in message


# -- the RAPI client ------------------------------------------------------------------------------------


async def test_rapi_client(full_config: Path) -> None:
    settings = Settings.from_file(full_config)
    patras = settings.backend("patras")
    client = patras.rapi_client()
    try:
        assert isinstance(client, RapiClient)
        assert client.url == "https://ganeti.patras.example.org:5080"
        assert client.username == "synnefo"
        assert client.max_connections == 5
        assert "patras-secret" not in repr(client)
    finally:
        await client.close()


async def test_rapi_client_over_plain_http_with_timeout() -> None:
    backend = BackendSettings(
        name="test", url="http://127.0.0.1:5080", username="u", password=SecretStr("p"), max_connections=3
    )
    client = backend.rapi_client(timeout=2.5)
    try:
        assert client.timeout == 2.5 and client.max_connections == 3
    finally:
        await client.close()


# -- [dispatcher] strategy, reloads, the package's modules ---------------------------------------------


def test_strategy_is_one_of_two(tmp_path: Path) -> None:
    settings = Settings(dispatcher={"strategy": "round_robin"})
    assert settings.dispatcher.strategy == "round_robin"
    assert Settings().dispatcher.strategy == "credits"
    path = write(tmp_path / "sg.toml", '[dispatcher]\nstrategy = "fastest"\n')
    with pytest.raises(ConfigError) as caught:
        Settings.from_file(path)
    assert str(caught.value) == (
        f"config file {path}: dispatcher.strategy: Input should be 'credits' or 'round_robin'"
    )


def test_diff_backends() -> None:
    def backend(name: str, **extra: object) -> dict[str, object]:
        return {
            "name": name,
            "url": f"https://{name}.example.org:5080",
            "username": "u",
            "password": "p",
        } | extra

    old = Settings(backends=[backend("a"), backend("b"), backend("c"), backend("d", drained=True)])
    new = Settings(
        backends=[backend("b", username="v"), backend("c", drained=True), backend("d"), backend("e")],
        database={"url": "sqlite:///other.db"},
    )
    changes = diff_backends(old, new)
    assert (changes.added, changes.removed, changes.changed) == (["e"], ["a"], ["b"])
    assert (changes.drained, changes.undrained, changes.database) == (["c"], ["d"], True)
    assert changes.describe() == ["removed a", "added e", "changed b", "drained c", "undrained d"]
    assert not diff_backends(old, old) and diff_backends(old, new)


def test_read_password_file_is_the_one_reader(tmp_path: Path) -> None:
    good = write(tmp_path / "good", "s3cret\n", 0o600)
    assert read_password_file(good) == "s3cret"
    loose = write(tmp_path / "loose", "s3cret\n", 0o640)
    with pytest.raises(ValueError, match="readable by others") as caught:
        read_password_file(loose)
    assert "s3cret" not in str(caught.value)


def test_every_name_is_importable_from_the_package() -> None:
    import synnefo_ganeti.config as config

    for name in config.__all__:
        assert getattr(config, name) is not None, name
    assert config.DEFAULT_OWNERSHIP_TAG == "synnefo-ganeti:owned"
    assert config.CONFIG_ENV_VAR == "SYNNEFO_GANETI_CONFIG" and config.ENV_PREFIX == "SYNNEFO_GANETI__"
