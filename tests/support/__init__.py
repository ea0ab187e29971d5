"""Fixtures, builders and worker scripts shared by the tests (importable as ``support.*``)."""
