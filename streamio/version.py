"""The version of streamio: the one place it is written in the package (a bottom module: no imports).

``streamio.__version__`` is this value; pyproject.toml and CHANGELOG.md say the same
(tests/core/test_version.py). Modules that record it (a checkpoint manifest's ``software``) import
it from here, not from the ``streamio`` package, which sits above every layer.
"""

__version__ = "0.2.0"
