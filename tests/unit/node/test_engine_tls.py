"""Engines off loopback only over TLS: the node refuses, with one line naming the flag, every
engine address the server would reach in clear text and every certificate it would refuse."""

from __future__ import annotations

import datetime
import os
import socket
from pathlib import Path

import pytest
from tlsfiles import make_ca

from grid_core.errors import ValidationError
from grid_core.nodeconfig import NodeConfig
from grid_core.tls import TlsError
from grid_node.engine_tls import engine_url, listen_address, load_engine_tls


def _config(tmp_path: Path, **kw: object) -> NodeConfig:
    return NodeConfig(state_dir=tmp_path / "node", model_dirs=(tmp_path,), **kw)  # type: ignore[arg-type]  # test passes loose kwargs


def test_engine_route_without_tls_off_loopback_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ValidationError, match=r"--advertise-host 198\.18\.3\.2: engines off loopback need TLS"
    ):
        _config(tmp_path, grid_url="https://198.18.3.1:22100", advertise_host="198.18.3.2")


def test_remote_grid_without_an_advertised_engine_address_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="cannot reach engines on this machine's loopback"):
        _config(tmp_path, grid_url="https://198.18.3.1:22100")


def test_tls_files_need_each_other_and_an_advertised_host(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="give both"):
        _config(tmp_path, advertise_host="198.18.3.2", engine_tls_cert=tmp_path / "c.pem")
    with pytest.raises(ValidationError, match="also pass --advertise-host"):
        _config(tmp_path, engine_tls_cert=tmp_path / "c.pem", engine_tls_key=tmp_path / "k.pem")


def test_engine_ca_defaults_to_the_grid_ca(tmp_path: Path) -> None:
    tls = {
        "advertise_host": "198.18.3.2",
        "engine_tls_cert": tmp_path / "c.pem",
        "engine_tls_key": tmp_path / "k.pem",
    }
    cfg = _config(tmp_path, grid_ca=tmp_path / "grid-ca.pem", **tls)
    assert cfg.engine_ca == tmp_path / "grid-ca.pem"
    cfg = _config(
        tmp_path, grid_ca=tmp_path / "grid-ca.pem", engine_tls_ca=tmp_path / "e.pem", **tls
    )
    assert cfg.engine_ca == tmp_path / "e.pem"


def test_loopback_node_keeps_its_plain_loopback_engines(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    assert not cfg.engine_tls_enabled and cfg.advertise_host is None


def test_a_good_certificate_is_accepted_for_ipv4_and_ipv6(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    cert, key = ca.issue(tmp_path, "node-a", ["198.18.3.2", "fd00::2", "node-a.lab"])
    for host in ("198.18.3.2", "fd00::2", "[fd00::2]", "node-a.lab"):
        tls = load_engine_tls(host, cert, key, ca.cert_path)
        assert tls.ca_pem is not None and "BEGIN CERTIFICATE" in tls.ca_pem


def test_san_mismatch_is_refused(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    cert, key = ca.issue(tmp_path, "node-a", ["198.18.3.2"])
    with pytest.raises(
        ValidationError, match=r"does not cover the advertised host '198\.18\.3\.9'"
    ):
        load_engine_tls("198.18.3.9", cert, key, ca.cert_path)


def test_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    cert, key = ca.issue(tmp_path, "node-a", ["198.18.3.2"], key_mode=0o644)
    with pytest.raises(TlsError, match=r"--engine-tls-key .*readable by others.*chmod 600"):
        load_engine_tls("198.18.3.2", cert, key, ca.cert_path)


def test_expired_certificate_is_refused(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    cert, key = ca.issue(tmp_path, "node-a", ["198.18.3.2"], not_after=past)
    with pytest.raises(ValidationError, match=r"--engine-tls-cert .*expired on"):
        load_engine_tls("198.18.3.2", cert, key, ca.cert_path)


def test_certificate_from_another_ca_is_refused(tmp_path: Path) -> None:
    ca = make_ca(tmp_path / "one", "ca-one")
    other = make_ca(tmp_path / "two", "ca-two")
    cert, key = ca.issue(tmp_path, "node-a", ["198.18.3.2"])
    with pytest.raises(ValidationError, match="not issued by a certificate in --engine-tls-ca"):
        load_engine_tls("198.18.3.2", cert, key, other.cert_path)


def test_key_of_another_certificate_is_refused(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    cert, _ = ca.issue(tmp_path / "a", "node-a", ["198.18.3.2"])
    _, other_key = ca.issue(tmp_path / "b", "node-b", ["198.18.3.2"])
    with pytest.raises(ValidationError, match="does not match --engine-tls-cert"):
        load_engine_tls("198.18.3.2", cert, other_key, ca.cert_path)
    assert os.stat(other_key).st_mode & 0o777 == 0o600


def test_address_family_follows_the_advertised_address() -> None:
    assert listen_address("198.18.3.2") == ("198.18.3.2", socket.AF_INET)
    assert listen_address("fd00::2") == ("fd00::2", socket.AF_INET6)
    assert listen_address("[fd00::2]") == ("fd00::2", socket.AF_INET6)
    assert engine_url("fd00::2", 22201) == "https://[fd00::2]:22201"
    assert engine_url("fe80::1%eth0", 22201) == "https://[fe80::1%25eth0]:22201"
    assert engine_url("198.18.3.2", 22201) == "https://198.18.3.2:22201"
