"""``grid test compete`` on a real logical fleet (issue 13, item 6).

One three-host fleet with real llama-server engines, started through the shipped CLI. The
coding portfolio is configured as an operator would, through ``grid allocator model set``:
the fleet's ``tiny-coder`` (a 128-wide, two-layer random model) and ``slow-coder``, a
512-wide, eight-layer random model written with ``grid test make-model`` into the fleet's
model directory. Neither answers a coding question correctly, so correctness ties at zero and
the measured latency decides; the larger model is several times slower per token, and it is
configured with the *higher* coding suitability, so only the measured evidence can make the
allocator prefer the other one. The test does not name the winner: it checks that the
report's winner is the best-measured candidate, that it served ordinary ``auto`` traffic,
that the runner-up served under the constraint, that the winner came back, and that every
profile the command edited is byte-for-byte the original afterwards (specification,
"Single-machine scenario lab and logical fleet test").

Three hosts, not four: the baseline holds one and the candidates one each. The coding leader
may stand by on an idle host before any coding request (docs/portfolio.md, "Standby"), so
the serve step constrains every candidate until none is resident before it sends traffic.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fleet_cli import default_sigint, grid, started_fleet
from ports import port

pytestmark = pytest.mark.e2e

ENGINE_PORT_BASE = port(23000)
"""Engine ports for this module's fleet: clear of the other e2e fleets' ranges."""
HOST_GIB = 3
"""Each logical host's memory (GiB): one candidate replica per host."""
FAST, SLOW = "tiny-coder.gguf", "slow-coder.gguf"
SLOW_LAYERS, SLOW_EMBEDDING = 8, 512
"""The slow candidate's shape: about 43 MB of weights, several times the per-token work of
``tiny-coder``."""
SLOW_SHARE = 0.62
"""The slow candidate's memory budget as a share of a host (the fleet's largest model's)."""
SUITABILITY = {FAST: "0.8", SLOW: "0.9"}
"""Configured coding suitability: the slow model is preferred until evidence says otherwise."""
QUESTIONS = 8
"""The command's question count (full quality confidence)."""
INTERRUPT_AFTER = "asked the allocator for one"
"""The progress line after which the interrupted run has a profile edit applied."""
INTERRUPT_WAIT_S = 120.0
"""Bound on the interrupted run's start and its clean-up (never timed)."""
SECOND_RUN_STEP_S = 120.0
"""The second run's step budget: a failure shows in two minutes, not four (never timed)."""


def _interrupted_run(home: Path) -> tuple[int, str]:
    """Start ``grid test compete``, press Ctrl-C once its first profile edit is applied;
    its exit code and stderr."""
    env = dict(os.environ, GRID_HOME=str(home))
    cmd = [sys.executable, "-c", "from grid_core.cli import main; main()", "test", "compete"]
    with subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=default_sigint,  # Ctrl-C must reach the command (see default_sigint)
    ) as proc:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if INTERRUPT_AFTER in line:
                proc.send_signal(signal.SIGINT)
                break
        rest, _ = proc.communicate(timeout=INTERRUPT_WAIT_S)
        return proc.returncode, "".join(seen) + rest


def _profile_versions(url: str, models: tuple[str, ...]) -> dict[str, str]:
    with httpx.Client(trust_env=False, timeout=30.0) as http:
        return {m: http.get(f"{url}/allocator/models/{m}").json()["version"] for m in models}


def _configure_candidates(home: Path, root: Path, url: str) -> None:
    """Write the slow model into the fleet's model directory and give both candidates a
    coding score, as an operator would."""
    slow = root / "models" / SLOW
    made = grid(
        home,
        "test",
        "make-model",
        str(slow),
        "--name",
        "slow-coder",
        "--layers",
        str(SLOW_LAYERS),
        "--embedding",
        str(SLOW_EMBEDDING),
        "--seed",
        "9",
    )
    assert made.returncode == 0, made.stdout + made.stderr
    sha = hashlib.sha256(slow.read_bytes()).hexdigest()
    slow_set = grid(
        home,
        "allocator",
        "model",
        "set",
        SLOW,
        "--grid",
        url,
        "--memory-mb",
        str(int(HOST_GIB * 1024 * SLOW_SHARE)),
        "--artifact-sha256",
        sha,
        "--workload-score",
        f"coding={SUITABILITY[SLOW]}",
        "--min-residency-s",
        "15",
        "--scale-down-cooldown-s",
        "15",
        "--load-estimate-s",
        "2",
        "--warm-estimate-s",
        "3",
        "--expected-service-time-s",
        "0.5",
    )
    assert slow_set.returncode == 0, slow_set.stdout + slow_set.stderr
    fast_set = grid(
        home, "allocator", "model", "set", FAST, "--grid", url,
        "--workload-score", f"coding={SUITABILITY[FAST]}",
    )  # fmt: skip
    assert fast_set.returncode == 0, fast_set.stdout + fast_set.stderr


def test_compete_picks_the_measured_winner_constrains_it_and_restores(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with started_fleet(
        home, machines=3, engine_port_base=ENGINE_PORT_BASE, capacities_gib="3,3,3"
    ) as (root, url, _token):
        refused = grid(home, "test", "compete", "--json")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "at least 2 coding candidates" in refused.stderr
        assert "--workload-score coding=" in refused.stderr  # the fix is named

        _configure_candidates(home, root, url)
        before = _profile_versions(url, (FAST, SLOW))
        # Ctrl-C with a temporary edit applied: the edit is undone before the command exits,
        # and the fleet stays usable for the full run below.
        code, output = _interrupted_run(home)
        print(output)
        assert code != 0 and f"the temporary edits of {SLOW} are undone" in output, output
        assert _profile_versions(url, (FAST, SLOW)) == before
        assert not (root / "compete-edits.json").exists()

        done = grid(home, "test", "compete", "--json")
        print(done.stderr)  # the progress lines: visible with -s and in a failure report
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads(done.stdout)
        print(json.dumps(report, indent=2))

        winner, runner_up = report["winner"], report["runner_up"]
        assert {winner, runner_up} == {FAST, SLOW}
        best, second = report["candidates"]
        assert best["model_id"] == winner and second["model_id"] == runner_up
        # The winner is the best-measured candidate, and the report says why in numbers.
        assert best["score"] > second["score"]
        for c in (best, second):
            assert c["questions"] == QUESTIONS and c["evaluations"] == QUESTIONS
            assert c["quality_confidence"] == 1.0 and c["host_id"].startswith("host-")
        assert "p50" in report["why"] and "correct" in report["why"]
        assert [s["step"] for s in report["steps"]] == [
            f"measure {SLOW}",
            f"measure {FAST}",
            "evidence",
            "serve",
            "constrain",
            "restore",
        ]
        # Ordinary auto traffic was served by the winner, by the runner-up under the
        # constraint, and by the winner again after it.
        assert report["auto_served_by"][winner] >= 2
        assert report["auto_served_by"][runner_up] >= 1
        constrain = next(s for s in report["steps"] if s["step"] == "constrain")
        assert "tags" in constrain["detail"] and runner_up in constrain["detail"]

        with httpx.Client(trust_env=False, timeout=30.0) as http:
            status = http.get(url + "/allocator/status?detail=1").json()
        ctl = status["controller"]
        ready = {
            r["model_id"]
            for h in ctl["hosts"]
            for r in h.get("residencies") or ()
            if r["state"] == "ready"
        }
        assert winner in ready  # left ready for interactive use
        assert ctl["portfolio"]["mapping"].get("coding") == winner
        # Every edited profile is back exactly; no edit journal is left.
        assert _profile_versions(url, (FAST, SLOW)) == before
        assert not (root / "compete-edits.json").exists()
        # Evaluation traffic named both models but is never demand for them.
        forecasts = ctl["forecasts"]
        assert not any((forecasts.get(m) or {}).get("direct") for m in (FAST, SLOW))
        quality = {(q["model_id"], q["workload"]): q for q in ctl["quality"]}
        assert quality[(winner, "coding")]["score"] > quality[(runner_up, "coding")]["score"]

        # Run it again at once: the coding workload is still admitted and may hold the winner
        # (or place it again a moment after a status read), so the serve step offloads every
        # candidate by its temporary edits (before, it waited for an offload the allocator
        # never made and failed after the step budget).
        again = grid(home, "test", "compete", "--json", "--step-timeout-s", str(SECOND_RUN_STEP_S))
        print(again.stderr)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "every candidate gets the temporary tag" in again.stderr
        assert json.loads(again.stdout)["winner"] == winner
        assert _profile_versions(url, (FAST, SLOW)) == before
        assert not (root / "compete-edits.json").exists()
