"""Command line entry point: `sr` and its alias `vllm-sr`.

Thin on purpose: each subcommand parses its arguments and calls library code. Usage
errors print one line on stderr and exit with status 2. One step comes before `sr serve`'s
own imports: its fork server is started (sr.pool.fork_start.start_early).
"""

from __future__ import annotations

import sys

SUBCOMMANDS = {
    "serve": "sr.router.serve_cli",
    "config": "sr.config.cli",
    "worker": "sr.worker.cli",
    "inventory": "sr.router.inventory_cli",
}

USAGE = "usage: sr {serve,worker,inventory,config} ..."


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    module_name = SUBCOMMANDS.get(command)
    if module_name is None:
        print(f"sr: unknown command {command!r}; {USAGE}", file=sys.stderr)
        return 2
    import importlib

    if command != "serve":
        return importlib.import_module(module_name).main(rest)
    # The fork server imports torch for seconds: started first, before `sr serve` imports
    # its own code and reads its config (sr.pool.fork_start), and never left behind.
    from sr.errors import UsageError
    from sr.pool import fork_start
    from sr.settings import read_process_settings

    try:
        fork_start.start_early(rest, read_process_settings().environ)
    except UsageError:  # a malformed variable: `sr serve` reports it and starts nothing
        pass
    try:
        return importlib.import_module(module_name).main(rest)
    finally:
        fork_start.discard()
