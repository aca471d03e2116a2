"""The root ``grid`` command.

Only ``grid plugins`` lives here; every other command group (``up``/``down``, ``allocator``,
``engine``, ``test``, ``bench``, ``models``, ``chat``) arrives through the
``grid_cli_commands`` hook from the package that owns it.

Exit codes: 0 success, 1 runtime failure, 2 usage error. A handled error prints one line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import typer

from grid_core.cliregistry import HELP_MARKUP, CliRegistry
from grid_core.errors import EXIT_RUNTIME_FAILURE, GridError
from grid_core.plugins import COLLECT_KINDS, HookStatus, Plugins, get_plugins


def _hook_statuses(plugins: Plugins) -> list[HookStatus]:
    try:
        return plugins.hook_status()
    except GridError as exc:  # e.g. two plugins register one adapter name: say so, list the rest
        typer.echo(f"grid: error: {exc}", err=True)
        return []


def _plugins_command(plugins: Plugins) -> Callable[[bool], None]:
    def plugins_cmd(
        as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    ) -> None:
        """List loaded plugins and, per hook, which implementation is active and which shadowed.

        Built-in implementations are defaults: a plugin's implementation of a first-result hook
        answers first, and its runtime adapter or score term replaces a built-in one of the
        same name.
        """
        statuses = _hook_statuses(plugins)
        if as_json:
            typer.echo(json.dumps(_plugins_report(plugins, statuses), indent=2))
        else:
            _print_plugins(plugins, statuses)
        # Each failure's one-line reason already went to stderr through the facade's report
        # (load failures at start-up, refused objects while the hooks above were resolved).

    return plugins_cmd


def _plugins_report(plugins: Plugins, statuses: list[HookStatus]) -> dict[str, object]:
    """``grid plugins --json``: loaded plugins, per-hook resolution and load failures."""
    return {
        "plugins": [
            {
                "name": info.name,
                "module": info.module,
                "distribution": info.distribution,
                "version": info.version,
                "hooks": list(info.hooks),
            }
            for info in plugins.infos
        ],
        "hooks": [
            {
                "hook": st.hook,
                "kind": st.kind,
                "active": list(st.active),
                "shadowed": list(st.shadowed),
                "refused": list(st.refused),
                "objects": st.objects,
            }
            for st in statuses
        ],
        "failures": [
            {"name": f.name, "cause": f.cause, "loaded": f.loaded} for f in plugins.failures
        ],
    }


def _print_plugins(plugins: Plugins, statuses: list[HookStatus]) -> None:
    """``grid plugins`` as tables: plugins, per-hook resolution, registered objects."""
    from grid_core.table import render_table

    typer.echo(
        render_table(
            ["plugin", "distribution", "version", "hooks"],
            [
                [
                    info.name,
                    info.distribution or "-",
                    info.version or "-",
                    ", ".join(info.hooks) or "-",
                ]
                for info in plugins.infos
            ],
        )
    )
    typer.echo("")
    typer.echo(
        render_table(
            ["hook", "kind", "active", "shadowed", "refused"],
            [
                [
                    st.hook,
                    st.kind.replace("_", " "),
                    ", ".join(st.active) or "-",
                    ", ".join(st.shadowed) or "-",
                    ", ".join(st.refused) or "-",
                ]
                for st in statuses
            ],
        )
    )
    objects = [
        [name, COLLECT_KINDS.get(st.hook, st.hook), plugin]
        for st in statuses
        for name, plugin in st.objects.items()
    ]
    if objects:
        typer.echo("")
        typer.echo(render_table(["object", "kind", "provided by"], objects))


def build_app(plugins: Plugins | None = None) -> typer.Typer:
    """The root Typer app with every plugin's commands mounted.

    Args:
        plugins: the facade to use; defaults to the installed entry points.
    """
    plugins = plugins or get_plugins()
    app = typer.Typer(
        name="grid",
        help="Grid: run an AI intranet — placement, reconciliation, routing, host protection.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=HELP_MARKUP,
    )

    @app.callback()
    def root() -> None:
        """Grid command line; every group below comes from a plugin."""

    app.command(name="plugins")(_plugins_command(plugins))
    plugins.cli_commands(CliRegistry(app))
    return app


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run ``grid`` and turn handled errors into one line + exit code.

    Usage errors are reported by the command-line parser itself (exit 2).
    """
    try:
        command = typer.main.get_command(build_app())
        command.main(args=argv, prog_name="grid")
    except GridError as exc:
        print(f"grid: error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except KeyboardInterrupt:
        print("grid: interrupted", file=sys.stderr)
        raise SystemExit(EXIT_RUNTIME_FAILURE) from None
