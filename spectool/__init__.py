"""spectool: declarative, verified patches for SGLang.

The public API is small: ``apply``, ``check``, ``status``, ``revert`` (spectool.api),
``load_recipes`` (spectool.recipe), ``locate`` (spectool.source) and ``build_plan``.
They are imported on first use, so ``spectool --help``, ``status`` and ``fetch`` do not load
libcst.
"""

__version__ = "0.2.0"

_API = {
    "apply": "api",
    "check": "api",
    "status": "api",
    "revert": "api",
    "build_plan": "plan",
    "load_recipes": "recipe",
    "locate": "source",
}

__all__ = ["apply", "check", "status", "revert", "build_plan", "load_recipes", "locate", "__version__"]


def __getattr__(name: str):
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'spectool' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
