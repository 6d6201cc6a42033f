"""`sr config show|validate [--config FILE]`."""

from __future__ import annotations

import sys
from pathlib import Path

from sr.config.arguments import OneLineArgumentParser, report_usage_error
from sr.config.load import dump_config, load_config
from sr.errors import ConfigError, ConfigIssue, UsageError

PROG = "sr config"


def issue_line(path: Path, issue: ConfigIssue) -> str:
    """`<file>: <path>: <message>`, without naming the file twice (YAML errors do)."""
    text = str(issue)
    return text if text.startswith(f"{path}:") else f"{path}: {text}"


def _parser() -> OneLineArgumentParser:
    parser = OneLineArgumentParser(prog=PROG, description="Show or validate the sr config.")
    parser.add_argument("action", choices=("show", "validate"))
    parser.add_argument("--config", default="config.yaml", help="default: ./config.yaml")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        return report_usage_error(PROG, exc)
    path = Path(args.config)
    if not path.exists():
        return report_usage_error(PROG, UsageError(f"no config at {path} (sr serve creates one)"))
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        out = sys.stdout if args.action == "validate" else sys.stderr
        for issue in exc.issues:
            print(issue_line(path, issue), file=out)
        return 2
    if args.action == "show":
        sys.stdout.write(dump_config(cfg))
    else:
        print(f"{path}: valid")
    return 0
