"""The control plane and the reconciler against the real Ganeti testbed (scripts/ganeti-testbed up).

Instances are created through the facade (``ControlPlane``) while a QueueWatcher keeps a fresh
store (SQLite and PostgreSQL) in step; then, with the watcher stopped, drift is made behind the
project's back with ``gnt-instance`` (shutdown, remove, modify -B, add of an owned instance).
``synnefo-ganeti reconcile`` finds each drift, ``--fix-all --delete-orphans`` repairs them, and a
third run is clean. Skipped where no cluster runs; in CI it must run (the ``testbed`` fixture
fails instead of skipping).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti import ControlPlane, NotFoundError, RapiClient
from synnefo_ganeti.config import Settings
from synnefo_ganeti.reconcile import Reconciler
from synnefo_ganeti.store import InstanceStatus, Store
from tests.conftest import Testbed
from tests.helpers import eventually
from tests.integration._testbed import BACKEND, DEADLINE, client, name, ns, ns30, spec, watching

pytestmark = [pytest.mark.ganeti, pytest.mark.timeout(180)]

ROOT = Path(__file__).parents[2]
OWNED_TAG = "synnefo-ganeti:owned"  # the default [ownership] tag


def settings(testbed, db_url: str) -> Settings:
    return Settings(
        database={"url": db_url},
        backends=[
            {
                "name": BACKEND,
                "url": testbed.url,
                "username": testbed.username,
                "password": testbed.password,
                "ca_file": testbed.ca_file,
            }
        ],
    )


def write_config(testbed, db_url: str, folder: Path) -> Path:
    """The TOML file the CLI reads: the same database and backend, the password in a 0600 file."""
    password_file = folder / "testbed.password"
    password_file.write_text(testbed.password + "\n")
    password_file.chmod(0o600)
    config = folder / "config.toml"
    config.write_text(
        "[database]\n"
        f"url = {json.dumps(db_url)}\n"
        "\n[[backends]]\n"
        f"name = {json.dumps(BACKEND)}\n"
        f"url = {json.dumps(testbed.url)}\n"
        f"username = {json.dumps(testbed.username)}\n"
        f"password_file = {json.dumps(str(password_file))}\n"
        f"ca_file = {json.dumps(testbed.ca_file)}\n"
    )
    return config


async def run(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=ROOT
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def gnt_instance(testbed, *args: str) -> str:
    """``gnt-instance ARGS`` in the cluster's namespace; it must succeed."""
    code, out, err = await run(*ns(testbed, "gnt-instance", *args))
    assert code == 0, f"gnt-instance {' '.join(args)}: exit {code}\n{out}\n{err}"
    return out


def cli_env() -> dict[str, str]:
    """This environment without settings of its own (only the config file speaks)."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.upper().startswith("SYNNEFO_GANETI__") and key.upper() != "SYNNEFO_GANETI_CONFIG"
    }


async def reconcile_cli(config: Path, *flags: str) -> tuple[int, dict[str, Any]]:
    """``synnefo-ganeti reconcile --config FILE FLAGS --json``: exit code and the JSON report."""
    code, out, err = await run(
        sys.executable, "-m", "synnefo_ganeti", "reconcile", "--config", str(config), *flags, "--json",
        env=cli_env(),
    )  # fmt: skip
    assert code in (0, 1), f"exit {code}\nstdout: {out}\nstderr: {err}"
    report = json.loads(out)
    [backend] = report["backends"]
    assert backend["name"] == BACKEND and backend["ok"] is True and backend["error"] is None, report
    return code, backend


def by_kind(drifts: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    keyed = {(drift["kind"], drift["instance"]): drift for drift in drifts}
    assert len(keyed) == len(drifts), drifts
    return keyed


async def remove_everywhere(rapi: RapiClient, names: list[str], testbed: Testbed | None = None) -> None:
    """Remove each of ``names`` Ganeti still has (RAPI, else gnt-instance); every one is tried.

    ``testbed``: the cluster whose ``scripts/ganeti-testbed ns`` the fallback uses (by default the
    3.0 one, the ``ganeti3`` tests' cluster)."""
    problems = []
    for instance in names:
        try:
            try:
                await rapi.get_instance(instance)
            except NotFoundError:
                continue
            await rapi.wait_for_job(await rapi.delete_instance(instance), timeout=120)
        except Exception as exc:  # fall back to the command line, report at the end
            argv = (
                ns(testbed, "gnt-instance", "remove", "-f", instance)
                if testbed
                else ns30("gnt-instance", "remove", "-f", instance)
            )
            code, out, err = await run(*argv)
            if code != 0:
                problems.append(f"{instance}: RAPI {exc!r}; gnt-instance remove: {out}{err}")
    assert not problems, f"instances left on the testbed: {problems}"


async def test_reconcile_repairs_drift_made_behind_the_back(testbed, db_url, tmp_path) -> None:
    stopped, gone, resized, orphan = names = [name("rec") for _ in range(4)]
    config = write_config(testbed, db_url, tmp_path)
    sets = settings(testbed, db_url)
    async with Store(db_url) as store, client(testbed) as rapi:
        try:
            async with ControlPlane(sets, store=store) as cp, watching(store) as (_watcher, task):
                # 1. three instances through the facade, STARTED once their creates end
                for instance in names[:3]:
                    row, job_id = await cp.create_instance(spec(testbed, instance), backend=BACKEND)
                    assert row.status is InstanceStatus.BUILD and row.owned and isinstance(job_id, int)
                for instance in names[:3]:

                    async def started(instance: str = instance) -> bool:
                        if task.done():
                            task.result()
                            pytest.fail("the watcher stopped by itself")
                        row = await cp.get_instance(instance, backend=BACKEND)
                        assert row is not None and row.status is not InstanceStatus.ERROR, row
                        return row.status is InstanceStatus.STARTED

                    await eventually(
                        started, timeout=DEADLINE, interval=0.1, what=f"{instance} STARTED in the database"
                    )

                # just created through the facade: no drift; the first pass records what Ganeti
                # made, and the next finds the three as their rows expect by comparing the cells
                # of real Ganeti's answer whole (reconcile/_pass.py)
                async with Reconciler(sets, store=store) as reconciler:
                    report = await reconciler.run_once()
                    again = await reconciler.run_once()
                assert report.ok, report.summary()
                assert report.clean, [drift.to_json() for drift in report.drifts]
                assert again.clean, [drift.to_json() for drift in again.drifts]
                assert (again.backends[0].settled, again.backends[0].observed) == (3, 0)

            # 2. the watcher is stopped: the database misses what follows
            await gnt_instance(testbed, "shutdown", "--timeout=0", stopped)
            await gnt_instance(testbed, "remove", "-f", gone)
            await gnt_instance(testbed, "modify", "-B", "maxmem=256,minmem=256", resized)
            await gnt_instance(
                testbed, "add", "-t", "diskless", "-o", "noop", "-n", testbed.node, "--no-name-check",
                "--no-ip-check", "--tags", OWNED_TAG, orphan,
            )  # fmt: skip
            assert OWNED_TAG in (await rapi.get_instance(orphan)).tags

            # 3. report only: each drift found, nothing fixed
            expected = {
                ("operstate", stopped),
                ("stale", gone),
                ("flavor", resized),
                ("orphan", orphan),
            }
            code, found = await reconcile_cli(config)
            drifts = by_kind(found["drifts"])
            assert code == 1
            assert set(drifts) == expected, found["drifts"]
            assert not any(drift["fixed"] for drift in drifts.values()), found["drifts"]
            assert "STOPPED in Ganeti" in drifts["operstate", stopped]["detail"]
            assert "not in Ganeti" in drifts["stale", gone]["detail"]
            assert "maxmem 128 expected, Ganeti has 256" in drifts["flavor", resized]["detail"]
            assert "not in the database" in drifts["orphan", orphan]["detail"]
            assert await rapi.get_instance(orphan)  # reporting deleted nothing
            before = {instance: await store.get_instance(BACKEND, instance) for instance in names[:3]}
            assert all(row is not None and row.status is InstanceStatus.STARTED for row in before.values())
            assert before[resized] is not None and before[resized].beparams is not None
            assert before[resized].beparams["maxmem"] == 128  # reporting changed nothing either

            # fixed: the same drifts, each fixed
            code, repaired = await reconcile_cli(config, "--fix-all", "--delete-orphans")
            fixed = by_kind(repaired["drifts"])
            assert code == 1  # drift was found (and fixed)
            assert set(fixed) == expected, repaired["drifts"]
            assert all(drift["fixed"] is True for drift in fixed.values()), repaired["drifts"]

            async def orphan_gone() -> bool:
                try:
                    await rapi.get_instance(orphan)
                except NotFoundError:
                    return True
                return False

            await eventually(
                orphan_gone, timeout=DEADLINE, interval=0.1, what=f"{orphan} removed from Ganeti"
            )
            rows = {instance: await store.get_instance(BACKEND, instance) for instance in names}
            assert rows[stopped] is not None and rows[stopped].status is InstanceStatus.STOPPED
            assert rows[gone] is not None and rows[gone].status is InstanceStatus.DESTROYED
            assert rows[resized] is not None and rows[resized].status is InstanceStatus.STARTED
            assert rows[resized].beparams is not None
            assert rows[resized].beparams["maxmem"] == 256 and rows[resized].beparams["minmem"] == 256
            assert rows[orphan] is None  # deleted from Ganeti, never adopted

            # and then nothing is left to find
            code, after = await reconcile_cli(config)
            assert (code, after["drifts"]) == (0, [])
        finally:
            await remove_everywhere(rapi, names, testbed)
