"""Restoring a checkpoint: which saves to try, the walk back, and a state decoded before it is loaded.

The walk (``walk``: the pointer's save first, then back through the current timeline, verified in
full, bad saves recorded), the saves it tries (``candidates``) and the two phases of loading
(``plan``: decode and check everything against the live objects, then load). The map of these
modules: docs/design.md "Layout and the direction of dependencies"; the design: docs/design.md
"Restore".
"""
