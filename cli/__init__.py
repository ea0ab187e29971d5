"""The ``streamio`` command (installed as ``streamio.cli``): parsing and progress only.

Each verb group is a module over what they share; the map of its modules and their layers:
docs/design.md "Layout and the direction of dependencies"; the verbs: docs/cli.md.
"""
