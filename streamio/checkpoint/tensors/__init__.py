"""Tensors in checkpoints: state trees as JSON and raw bytes, host buffers and parts, sharded boxes.

What a save does to a state's tensors and a restore reads back: state dicts as tagged JSON with
tensor references, never pickled (``tree``); the host buffer, byte layout and parts (``serialize``);
wrapper-independent module keys (``wrappers``); DTensor state saved as each rank's local boxes and
restored onto any sharding with ranged, block-verified reads (``boxes``, ``shards``, ``fetch``,
``resharding``, ``app_state``). Nothing here knows the root's documents (:mod:`..root`) or the
commit protocol (:mod:`..save`). The map of these modules: docs/design.md "Layout and the
direction of dependencies"; the design: docs/design.md "Checkpoints", docs/sharded-checkpoints.md.
"""
