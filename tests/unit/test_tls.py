"""Trusting a self-signed certificate like Ganeti's: CA file, pinned fingerprint, or loudly not at all."""

from __future__ import annotations

import logging

import pytest

from synnefo_ganeti import RapiClient, TLSError
from synnefo_ganeti.rapi import parse_fingerprint
from tests.helpers import ONCE, StubRapi, make_certificate, stub_client


@pytest.fixture
def certs(tmp_path):
    return make_certificate(tmp_path), make_certificate(tmp_path, "other.example.com")


def client(url: str, **kwargs) -> RapiClient:
    return stub_client(url, retry=ONCE, **kwargs)


async def test_ca_file_trusts_ganetis_kind_of_certificate(certs) -> None:
    ours, _ = certs
    async with StubRapi(certificate=ours) as stub:
        stub.route("GET", "/version", 2)
        # The certificate names ganeti.example.com, we connect to 127.0.0.1: like Ganeti's own
        # client, the hostname is not checked against a pinned CA file by default.
        async with client(stub.url, ca_file=ours.cert) as rapi:
            assert await rapi.version() == 2
        async with client(stub.url, ca_file=ours.cert, verify_hostname=True) as rapi:
            with pytest.raises(TLSError, match="TLS verification failed"):
                await rapi.version()


async def test_wrong_ca_file_is_refused(certs) -> None:
    ours, other = certs
    async with StubRapi(certificate=ours) as stub:
        stub.route("GET", "/version", 2)
        async with client(stub.url, ca_file=other.cert) as rapi:
            with pytest.raises(TLSError, match="ca_file") as caught:
                await rapi.version()
    assert caught.value.maybe_sent is False
    assert not stub.seen  # nothing, credentials included, went to the untrusted server


async def test_system_store_refuses_self_signed(certs) -> None:
    ours, _ = certs
    async with StubRapi(certificate=ours) as stub, client(stub.url) as rapi:
        with pytest.raises(TLSError, match="self-signed certificate"):
            await rapi.version()
    assert not stub.seen


async def test_pinned_fingerprint(certs) -> None:
    ours, other = certs
    async with StubRapi(certificate=ours) as stub:
        stub.route("GET", "/version", 2)
        async with client(stub.url, fingerprint=ours.sha256) as rapi:
            assert await rapi.version() == 2
        async with client(stub.url, fingerprint=other.sha256.replace(":", "").lower()) as rapi:
            with pytest.raises(TLSError, match="fingerprint mismatch") as caught:
                await rapi.version()
    assert ours.sha256 in str(caught.value)  # tells what the server has
    assert len(stub.seen) == 1


async def test_insecure_works_and_says_so(certs, caplog) -> None:
    ours, _ = certs
    caplog.set_level(logging.WARNING, logger="synnefo_ganeti.rapi")
    async with StubRapi(certificate=ours) as stub:
        stub.route("GET", "/version", 2)
        async with client(stub.url, insecure=True) as rapi:
            assert await rapi.version() == 2
    assert "TLS verification is OFF" in caplog.text and stub.url in caplog.text


def test_fingerprint_forms() -> None:
    raw = bytes(range(32))
    colon = raw.hex(":").upper()
    assert parse_fingerprint(colon) == raw
    assert parse_fingerprint(raw.hex()) == raw
    assert parse_fingerprint("sha256:" + raw.hex()) == raw
    with pytest.raises(ValueError, match="SHA-256"):
        parse_fingerprint(raw.hex()[:-2])
