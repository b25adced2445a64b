"""The fake Ganeti can keep its certificate (``tls_dir``, ``--tls-dir``), as ganeti-rapi serves the
``rapi.pem`` made at ``gnt-cluster init`` at every start (issue 28, item 6)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from synnefo_ganeti import RapiClient
from synnefo_ganeti.cli import main
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.testing._tls import write_certificate


def exists(path: str) -> bool:
    return Path(path).exists()


async def test_a_kept_certificate_is_served_again_after_a_restart(tmp_path: Path) -> None:
    tls = tmp_path / "tls"
    async with FakeGaneti(tls_dir=tls, nodes=2) as first:
        assert first.ca_file == str(tls / "rapi.pem")
        fingerprint = first.fingerprint
        ca_file = first.ca_file
    # kept after the fake stopped
    assert (tls / "rapi.pem").exists() and (tls / "rapi.key").stat().st_mode & 0o077 == 0
    pem = (tls / "rapi.pem").read_bytes()
    async with FakeGaneti(tls_dir=tls, nodes=2) as second:
        assert second.fingerprint == fingerprint and second.ca_file == ca_file
        assert (tls / "rapi.pem").read_bytes() == pem
        # a client that trusted the first run's certificate trusts the second run
        async with RapiClient(
            second.url, username=second.username, password=second.password, ca_file=ca_file
        ) as by_ca:
            assert len(await by_ca.list_nodes()) == 2
        async with RapiClient(
            second.url, username=second.username, password=second.password, fingerprint=fingerprint
        ) as pinned:
            assert len(await pinned.list_nodes()) == 2


async def test_a_certificate_given_in_the_folder_is_used(tmp_path: Path) -> None:
    _, _, fingerprint = write_certificate(tmp_path)  # rapi.pem, rapi.key made elsewhere
    async with FakeGaneti(tls_dir=tmp_path) as fake:
        assert fake.fingerprint == fingerprint


async def test_without_a_tls_dir_each_start_makes_a_new_one() -> None:
    async with FakeGaneti() as first:
        fingerprint, ca_file = first.fingerprint, first.ca_file
        assert ca_file is not None and exists(ca_file)
    assert not exists(ca_file)  # removed on exit
    async with FakeGaneti() as second:
        assert second.fingerprint != fingerprint


def test_a_tls_dir_needs_tls(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tls_dir needs tls=True"):
        FakeGaneti(tls=False, tls_dir=tmp_path)


async def test_a_folder_with_half_a_pair_is_refused(tmp_path: Path) -> None:
    write_certificate(tmp_path)
    (tmp_path / "rapi.key").unlink()
    fake = FakeGaneti(tls_dir=tmp_path)
    with pytest.raises(ValueError, match=r"rapi\.pem without rapi\.key"):
        await fake.start()
    assert fake.url == "" and fake.queue_dir is None  # nothing was started


async def test_a_key_of_another_certificate_is_refused(tmp_path: Path) -> None:
    write_certificate(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    write_certificate(other)
    (tmp_path / "rapi.key").write_bytes((other / "rapi.key").read_bytes())
    with pytest.raises(ValueError, match=r"rapi\.key is not the key of rapi\.pem"):
        await FakeGaneti(tls_dir=tmp_path).start()


def test_the_command_refuses_tls_dir_with_no_tls(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["fake-ganeti", "--no-tls", "--tls-dir", str(tmp_path)])
    assert result.exit_code == 2 and "--tls-dir" in result.output and "--no-tls" in result.output


async def test_the_command_names_a_bad_tls_dir(tmp_path: Path) -> None:
    (tmp_path / "rapi.key").write_text("not a key\n")
    result = await asyncio.to_thread(
        CliRunner().invoke, main, ["fake-ganeti", "--port", "0", "--tls-dir", str(tmp_path)]
    )
    assert (
        result.exit_code == 2
        and "--tls-dir" in result.output
        and "rapi.key without rapi.pem" in result.output
    )


async def _run_command(tls: Path, queue: Path) -> dict[str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "synnefo_ganeti", "fake-ganeti", "--port", "0", "--json",
        "--tls-dir", str(tls), "--queue-dir", str(queue),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        text = b""
        while not text.rstrip().endswith(b"}"):
            text += await asyncio.wait_for(process.stdout.readline(), 30)
        details: dict[str, str] = json.loads(text)
        async with RapiClient(
            details["url"], username=details["username"], password=details["password"],
            fingerprint=details["fingerprint"],
        ) as rapi:  # fmt: skip
            assert len(await rapi.list_nodes()) == 3
        return details
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 10) == 0


@pytest.mark.slow
async def test_the_command_keeps_its_certificate_across_restarts(tmp_path: Path) -> None:
    tls, queue = tmp_path / "tls", tmp_path / "queue"
    first = await _run_command(tls, queue)
    second = await _run_command(tls, queue)
    assert first["ca_file"] == second["ca_file"] == str(tls / "rapi.pem")
    assert first["fingerprint"] == second["fingerprint"]
