"""Daemon logs: the ``grid`` loggers reach stderr at INFO (``server.log``/``agent.log``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from grid_core.system.logs import LOG_LEVEL_ENV, configure_daemon_logging


@pytest.fixture
def grid_logger() -> Iterator[logging.Logger]:
    root = logging.getLogger("grid")
    saved = (list(root.handlers), root.level, root.propagate)
    yield root
    root.handlers[:], root.level, root.propagate = saved[0], saved[1], saved[2]


def test_decisions_reach_stderr_once_at_info(
    grid_logger: logging.Logger, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(LOG_LEVEL_ENV, raising=False)
    configure_daemon_logging()
    configure_daemon_logging()  # idempotent: no second handler, no doubled lines
    logging.getLogger("grid.server.controller").info("issued warm m on h1")
    logging.getLogger("grid.node").debug("not shown at INFO")
    err = capsys.readouterr().err
    assert err.count("issued warm m on h1") == 1
    assert "INFO grid.server.controller: issued warm m on h1" in err
    assert "not shown" not in err


def test_a_bad_level_name_falls_back_and_says_so(
    grid_logger: logging.Logger, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LOG_LEVEL_ENV, "chatty")
    configure_daemon_logging()
    assert grid_logger.level == logging.INFO
    assert "GRID_LOG_LEVEL='CHATTY' is not a log level; using INFO" in capsys.readouterr().err
