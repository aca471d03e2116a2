"""Linux user activity from logind: only an active graphical session's idle hint counts."""

from __future__ import annotations

from grid_node.telemetry import logind_idle_s

NOW = 1_800_000_000.0


def session(type_: str, idle: str, since_s: float = 0.0, active: str = "yes") -> str:
    return (
        f"Type={type_}\nClass=user\nActive={active}\nIdleHint={idle}\n"
        f"IdleSinceHint={int(since_s * 1e6)}\n"
    )


def test_an_active_desktop_session_means_the_owner_is_here() -> None:
    out = session("wayland", "no") + "\n" + session("tty", "yes", NOW - 9000)
    assert logind_idle_s(out, NOW) == 0.0


def test_an_idle_desktop_reports_seconds_since_its_idle_hint() -> None:
    out = session("x11", "yes", NOW - 600) + "\n" + session("wayland", "yes", NOW - 120)
    assert logind_idle_s(out, NOW) == 120.0


def test_no_graphical_session_is_unknown_not_idle() -> None:
    # ssh and tty sessions never update IdleHint: they say nothing about the owner.
    assert logind_idle_s(session("tty", "no") + "\n" + session("unspecified", "no"), NOW) is None
    assert logind_idle_s("", NOW) is None
    assert logind_idle_s(session("x11", "no", active="no"), NOW) is None
