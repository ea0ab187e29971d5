"""What a checkpoint root holds, as data: paths, documents and their records, checks, timelines, retention (PURE).

No torch, fsspec, storage, clock or environment (an import-linter contract checks it), so the
formats can be read, validated and property-tested without a training stack. The map of these
modules is docs/design.md "Layout and the direction of dependencies"; the formats themselves,
docs/design.md "Checkpoints".
"""
