"""The ``streamio`` command (installed as ``streamio.cli``): parsing and progress only."""
