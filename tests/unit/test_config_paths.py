"""A SQLite ``[database] url`` written in the config file is taken from the file's folder, like
every other path of the file; one given by the environment or on the command line from the
working directory (issue 28, item 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from synnefo_ganeti.cli._options import database_url
from synnefo_ganeti.config import Settings
from synnefo_ganeti.config._loading import sqlite_url_from
from synnefo_ganeti.store import Store


def write_config(folder: Path, url: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    secret = folder / "webhook.secret"
    secret.write_text("a-long-enough-webhook-secret-for-the-tests\n")
    secret.chmod(0o600)
    path = folder / "sg.toml"
    path.write_text(f'[database]\nurl = "{url}"\n\n[notify]\nsecret_file = "webhook.secret"\n')
    return path


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("sqlite:///state.db", "sqlite:///{folder}/state.db"),
        ("sqlite+aiosqlite:///data/state.db", "sqlite+aiosqlite:///{folder}/data/state.db"),
        ("sqlite:///state.db?timeout=3", "sqlite:///{folder}/state.db?timeout=3"),
        ("sqlite:///../state.db", "sqlite:///{folder}/../state.db"),
    ],
)
def test_a_relative_sqlite_path_is_taken_from_the_config_files_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: str, expected: str
) -> None:
    config = write_config(tmp_path / "etc", written)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    settings = Settings.from_file(config)
    assert settings.database.url == expected.format(folder=config.parent)
    # the same folder as the file's other relative paths
    assert settings.notify.secret_file == config.parent / "webhook.secret"


def test_two_working_directories_one_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write_config(tmp_path / "etc", "sqlite:///state.db")
    urls = []
    for cwd in (tmp_path / "one", tmp_path / "two"):
        cwd.mkdir()
        monkeypatch.chdir(cwd)
        urls.append(Settings.from_file(config).database.url)
        # what the CLI uses when only --config is given
        assert database_url(config, None) == urls[-1]
    assert urls[0] == urls[1] == f"sqlite:///{config.parent}/state.db"


async def test_the_store_opens_the_file_next_to_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path / "etc", "sqlite:///state.db")
    monkeypatch.chdir(tmp_path)
    async with Store(Settings.from_file(config).database.url, create=True):
        pass
    assert (config.parent / "state.db").exists()
    assert not (tmp_path / "state.db").exists()


@pytest.mark.parametrize(
    "written",
    [
        "sqlite://",  # in memory
        "sqlite:///:memory:",
        "sqlite+aiosqlite:///:memory:",
        "sqlite:////var/lib/synnefo-ganeti/state.db",  # absolute
        "sqlite:///file:state.db?mode=ro&uri=true",  # a SQLite URI: as written
        "postgresql://sg:secret@db.example.org/cloud",
    ],
)
def test_other_urls_are_kept_as_written(tmp_path: Path, written: str) -> None:
    assert Settings.from_file(write_config(tmp_path, written)).database.url == written


def test_home_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert sqlite_url_from("sqlite:///~/state.db", tmp_path / "etc") == f"sqlite:///{tmp_path}/home/state.db"


def test_the_environment_and_the_command_line_are_taken_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path / "etc", "sqlite:///state.db")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SYNNEFO_GANETI__DATABASE__URL", "sqlite:///from-env.db")
    # the environment overrides the file, and its path stays relative: the working directory's
    assert Settings.from_file(config).database.url == "sqlite:///from-env.db"
    monkeypatch.delenv("SYNNEFO_GANETI__DATABASE__URL")
    # --db URL wins over the file and is used as given
    assert database_url(config, "sqlite:///from-flag.db") == "sqlite:///from-flag.db"
    # keyword arguments too
    assert Settings(database={"url": "sqlite:///kw.db"}).database.url == "sqlite:///kw.db"


def test_the_default_without_a_url_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "sg.toml"
    path.write_text("[reconcile]\ninterval = 60\n")
    assert Settings.from_file(path).database.url == "sqlite:///synnefo-ganeti.db"


def test_a_reload_compares_the_resolved_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from synnefo_ganeti.config import diff_backends

    config = write_config(tmp_path / "etc", "sqlite:///state.db")
    monkeypatch.chdir(tmp_path)
    before = Settings.from_file(config)
    monkeypatch.chdir(tmp_path / "etc")
    assert not diff_backends(before, Settings.from_file(config)).database
