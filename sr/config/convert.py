"""attrs <-> plain data (cattrs), and the one checked path from data to a config.

`structure_checked` is what both loading and `validate` use: the shape check on plain
data (types, unknown keys), cattrs structuring of the cleaned data, then the semantic
rules, so a config built in Python is held to exactly the rules of a YAML file.
"""

from __future__ import annotations

from typing import Any

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from sr.config import schema
from sr.config.schema import SrConfig, yaml_key
from sr.config.shape import check_document
from sr.config.validate import semantic_issues
from sr.errors import ConfigIssue

_CLASSES = (
    schema.InputLimits,
    schema.OutlierDetection,
    schema.Replica,
    schema.Deployment,
    schema.DecisionModel,
    schema.System,
    schema.ModelCatalog,
    schema.RouterSettings,
    schema.GlobalSection,
    schema.Listener,
    schema.SrConfig,
)


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter()
    for cls in _CLASSES:
        overrides = {}
        for field in attrs.fields(cls):
            # A None default marks an optional field: the canonical dump leaves it out;
            # so does `omit_if_default` metadata (a default that configs rarely change).
            omit = field.default is None or field.metadata.get("omit_if_default", False)
            overrides[field.name] = override(
                rename=yaml_key(field) if yaml_key(field) != field.name else None,
                omit_if_default=omit,
            )
        conv.register_structure_hook(cls, make_dict_structure_fn(cls, conv, **overrides))
        conv.register_unstructure_hook(
            cls, _in_field_order(cls, make_dict_unstructure_fn(cls, conv, **overrides))
        )
    return conv


def _in_field_order(cls: type, unstructure):
    # cattrs emits omit-if-default fields after the others; the dump keeps the schema's field order.
    order = [yaml_key(f) for f in attrs.fields(cls)]

    def hook(obj):
        raw = unstructure(obj)
        return {key: raw[key] for key in order if key in raw}

    return hook


CONVERTER = _make_converter()


def structure_checked(data: Any) -> tuple[SrConfig, list[ConfigIssue]]:
    """Plain data (as from YAML) -> (config, every issue). The config is usable only
    when there are no issues: malformed values were replaced by their defaults."""
    cleaned, shape_issues = check_document(data, SrConfig)
    cfg = CONVERTER.structure(cleaned, SrConfig)
    reported = [i.path for i in shape_issues]
    if "" in reported:  # the document itself is wrong; rules about its parts would mislead
        return cfg, shape_issues
    # A value already reported as malformed was replaced by its default; semantic checks
    # of that value (or below it) would only repeat the report.
    semantic = [
        i
        for i in semantic_issues(cfg)
        if not any(i.path == p or i.path.startswith((p + ".", p + "[")) for p in reported)
    ]
    return cfg, shape_issues + semantic


def validate(cfg: SrConfig) -> list[ConfigIssue]:
    """Every problem of `cfg`, each with its path; empty when it is valid."""
    try:
        data = CONVERTER.unstructure(cfg)
    except Exception as exc:  # e.g. a dict where a Replica belongs, built in Python
        return [ConfigIssue("", f"malformed config object: {exc!r}")]
    return structure_checked(data)[1]
