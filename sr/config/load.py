"""YAML <-> attrs for the canonical config: parse, validate, dump, atomic write.

The canonical dump is what `sr serve` writes: the schema's field order, `global` as the
key, optional fields that are null left out, block style, sequences indented. Loading a
canonical file and dumping it again gives the same bytes.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import yaml

from sr.config.convert import CONVERTER, structure_checked, validate
from sr.config.schema import SrConfig
from sr.errors import ConfigError, ConfigIssue

__all__ = [
    "dump_config",
    "load_config",
    "parse_config",
    "validate",
    "write_config_atomic",
]


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str | int | float | bool):
                continue  # unhashable keys are reported by the shape check
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _CanonicalDumper(yaml.SafeDumper):
    """Indents sequences under their key, as the documented examples do."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


def _yaml_error(exc: yaml.YAMLError, source: str) -> ConfigIssue:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
    return ConfigIssue("", f"{where}: invalid YAML: {problem}")


def parse_config(text: str, source: str = "<config>") -> SrConfig:
    """Parse and validate YAML text; raises ConfigError listing every issue."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_error(exc, source)]) from None
    cfg, issues = structure_checked(data)
    if issues:
        raise ConfigError(issues)
    return cfg


def load_config(path: str | os.PathLike) -> SrConfig:
    """Read, parse and validate a config file; raises ConfigError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError([ConfigIssue("", f"cannot read {path}: {reason}")]) from None
    return parse_config(text, str(path))


def dump_config(cfg: SrConfig) -> str:
    """The canonical YAML text of `cfg`."""
    return yaml.dump(
        CONVERTER.unstructure(cfg),
        Dumper=_CanonicalDumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=1 << 30,  # never fold long strings (artifact paths)
    )


def write_config_atomic(path: str | os.PathLike, cfg: SrConfig) -> None:
    """Write the canonical dump: temp file in the same directory, fsync, rename.

    Readers see the old file or the new one, never a partial write. An existing file's
    permission bits are kept (it may hold API keys); a symlink keeps pointing at it.
    """
    # Through a symlink, replace its target: replacing the link would orphan the target.
    path = Path(os.path.realpath(path))
    text = dump_config(cfg).encode("utf-8")
    directory = path.parent
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable; not every platform lets a directory be opened.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
