"""`servecast` command line. Each command group lives in its own module with a `register(app)`;
this module only assembles them and turns user errors into one line and a non-zero exit."""

from __future__ import annotations

import importlib
import sys

import typer

try:  # typer >= 0.20 vendors its own click
    from typer._click import exceptions as _click_exceptions
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as _click_exceptions

from model.specs.errors import ServecastError

COMMAND_MODULES = ("hardware", "arch", "perf", "cache", "plan", "serve", "papers", "batch",
                   "validate")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: rich's formatter takes longer to load than the command
    help="Servecast: predict LLM serving performance and cost for agentic traffic.",
)
for _name in COMMAND_MODULES:
    importlib.import_module(f"model.frontends.cli.{_name}").register(app)


def main(argv: list[str] | None = None) -> int:
    """Entry point: user errors print `servecast: error: ...` on stderr and exit 2."""
    try:
        return app(args=argv, standalone_mode=False) or 0
    except ServecastError as err:
        print(f"servecast: error: {err}", file=sys.stderr)
        return 2
    except typer.Exit as done:
        return done.exit_code
    except (typer.Abort, KeyboardInterrupt):
        print("servecast: aborted", file=sys.stderr)
        return 130
    except _click_exceptions.NoArgsIsHelpError as err:
        err.show()
        return 2
    except _click_exceptions.ClickException as err:  # usage errors: bad flag, missing argument
        print(f"servecast: error: {err.format_message()}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
