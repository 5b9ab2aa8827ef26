"""spectool: declarative, verified patches for SGLang.

The public API is small: ``apply``, ``check``, ``status``, ``revert`` (spectool.api),
``load_recipes`` (spectool.recipe), ``locate`` (spectool.source) and ``build_plan``.
"""

__version__ = "0.1.0"

from .api import apply, check, revert, status  # noqa: E402
from .plan import build_plan  # noqa: E402
from .recipe import load_recipes  # noqa: E402
from .source import locate  # noqa: E402

__all__ = ["apply", "check", "status", "revert", "build_plan", "load_recipes", "locate", "__version__"]
