"""sr: a Trio router that serves small encoder models as pools of worker processes.

`sr.open_router(config)` (the pool, embedded in a Trio program) and `sr.serve(config)`
(the HTTP front end) are imported on first use, so `import sr` stays cheap.
"""

__version__ = "0.1.0"

_LAZY = {"open_router": "sr.pool.core", "serve": "sr.router.serve"}
__all__ = ["__version__", "open_router", "serve"]


def __getattr__(name: str):
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'sr' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
