"""HTTP refusals map to CLI exit codes: operator input 2, environment/remote 1."""

from __future__ import annotations

import pytest

from grid_core.errors import EXIT_RUNTIME_FAILURE, EXIT_USAGE
from grid_server.client import exit_code_for


@pytest.mark.parametrize("status", [400, 404, 409, 413, 422])
def test_operator_input_refusals_exit_2(status: int) -> None:
    assert exit_code_for(status) == EXIT_USAGE


@pytest.mark.parametrize("status", [401, 403, 500, 502, 503])
def test_credential_and_server_failures_exit_1(status: int) -> None:
    assert exit_code_for(status) == EXIT_RUNTIME_FAILURE
