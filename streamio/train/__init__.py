"""The reference trainer: DDP or FSDP2 over streamio's datasets and checkpoints, exact on resume.

``python -m streamio.train`` is one rank (launch several with torchrun); ``make demo`` runs
``python -m streamio.train.demo``, which crashes a run and shows that its resume reproduces the
uninterrupted run bit for bit. Not part of the library's public API: a worked example to read and
copy. The map of its modules: docs/design.md "Layout and the direction of dependencies"; what it
shows: docs/design.md "Bit-exact resume: what is captured".
"""
