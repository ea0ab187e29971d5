"""Deterministic, elastic sample assignment: which samples each (epoch, rank, worker) reads.

This package is PURE: it does no I/O, imports neither torch nor fsspec, reads no environment, clock
or process state. Everything is an argument (per-shard sample counts, seed, epoch, a
:class:`Topology` of ranks, DataLoader workers and batch size, a :class:`Sampling` of shuffle and
tail policy, a resume state); the data set gathers rank and worker ids from torch and passes them
down. Memory and time are O(shards + ranks x workers), never O(samples): every assignment is a list
of **runs** ``Run(shard, first, end)`` that a reader turns into one sequential ranged read each.

Algorithm (one epoch)
---------------------
1. **Global sequence G.** Shards are permuted with a generator keyed by the tuple
   ``(seed, epoch)`` (``Shuffle(shards=False)`` keeps index order). G is the concatenation of the
   shards' samples in that order; a position ``p`` of G names one sample. Every rank computes the
   same G without communicating.
2. **Stage sequence S.** A fresh epoch plans ``S = G``. A resumed epoch whose topology changed plans
   S = the not-yet-consumed positions of the previous stage, in their original order (see below).
   S is kept as a list of intervals of G, so it stays O(shards) (plus fragments, see Resume).
3. **Tail policy, in samples, identical on every rank.** With ``L = len(S)`` and ``R`` ranks:
   ``"drop"``: each rank gets ``P = L // R`` and the last ``L - R*P`` positions of S are dropped;
   ``"pad"``: ``P = ceil(L / R)`` and the ``R*P - L`` extra positions wrap to the start of S
   (again and again if ``R > L``, so a world larger than the data set still works). The plan
   states both numbers (:attr:`EpochPlan.dropped`, :attr:`EpochPlan.padding`); never more than
   ``R - 1``.
4. **Ranks get contiguous blocks** ``[r*P, (r+1)*P)`` of the padded/truncated sequence: long runs,
   and a rank's shard set changes every epoch because G does (no fixed shard-to-rank mapping).
5. **Workers get contiguous sub-blocks, in whole batches.** The rank's ``P`` samples form
   ``NB = ceil(P / B)`` batches of the batch size ``B`` (1 = plain samples); batch ``b`` belongs to
   worker ``b % W``, exactly the round-robin order in which ``torch.utils.data.DataLoader`` takes
   batches from ``W`` workers. Worker ``w`` owns ``ceil((NB - w) / W)`` whole batches, as one
   contiguous block; only the rank's single last batch can be partial (``P % B`` samples). So
   every rank yields the same number of samples and of batches, with or without ``drop_last``
   (which then drops the same ``P % B`` samples on every rank), and a worker's partial batch never
   appears mid-epoch. ``num_workers=0`` is one stream, identical to ``num_workers=1``.
6. **Sample-level shuffle (optional, ``Shuffle(window=K)``).** Each worker block is cut into
   windows of ``K`` consecutive samples; window ``j`` is yielded in a permutation keyed by
   ``(seed, epoch, stage, rank, worker, j)``. The reader reads a window's runs sequentially (long
   reads are kept), buffers ``K`` samples and yields them permuted. The order is a pure function of
   the plan, not of the reader, so a resume recomputes it: no shuffle-buffer state to save. Cost:
   one ``K``-element permutation per window, generated lazily; memory ``K`` samples. Quality is
   local by design (a sample moves at most ``K - 1`` places; neighbours come from the same
   one or two shards when ``K`` is below the shard size); the shard order supplies the global
   mixing. ``benchmarks/bench_plan.py`` measures both.

Permutations are keyed by int tuples through BLAKE2b and SplitMix64 in our own numpy arithmetic
(sort random keys made distinct by the index in their low bits): the same on every machine and
numpy version, unlike ``Generator.permutation`` whose stream numpy may change between releases
(which would silently break saved states); no ``hash()`` is involved, and a 4,096-sample window
costs ~0.1 ms.

Resume state
------------
A small, JSON-safe dict (:meth:`EpochPlan.state_dict`)::

    {"version": 1,
     "fingerprint": {"samples": "sha256:...", "index": str | None, "seed": int,
                     "policy": "pad", "shuffle": {"shards": true, "window": 0}},
     "epoch": 3,
     "stages": [{"world_size": 8, "num_workers": 4, "batch_size": 32, "batches": 1200}, ...]}

Each stage records a topology and how many batches each rank's consumer received (one int when
all ranks agree, as under DDP, else one per rank). Nothing else is needed because the plan is a
pure function of the state: resuming replays the stages.

* **Same topology** (same world size, workers, batch size as the last stage, and equal consumption
  on all ranks): the last stage continues. Worker ``w`` resumes at its exact position (the number of
  its batches among the first ``C`` of the round-robin), inside its shuffle window if needed, so the
  remainder is exactly the uninterrupted order. A fresh DataLoader starts its round-robin at worker
  0, so loader worker ``w`` is given the stream of plan worker ``(C + w) % W``: the next batch comes
  from the worker the uninterrupted run would have asked.
* **New topology** (or unequal consumption): the remaining positions of every old (rank, worker)
  stream, in old sequence order, become the sequence S of a new stage, planned from step 2 with the
  new topology. Nothing consumed is repeated, nothing unconsumed is lost (beyond the new stage's
  stated tail policy), and it composes over any number of changes. A partially consumed shuffle
  window leaves its unconsumed samples as fragments of S (up to ``K`` runs per old worker, about
  ``K / 5`` on average); they are exact, and :attr:`Window.spans` coalesces them into few ranged
  reads (read amplification <= 2x). Re-planning permutes each old worker's partial window once,
  vectorised (512 x 8 workers with window 4096: 16 M keys, under a second on a loaded 2-core VM)
  and holds O(fragments) memory; without a window it is O(old ranks x workers) and no fragments
  arise. With lanes (``Shuffle(interleave>1)``, the default) each old worker's partial window is
  rebuilt on its own (shared lane arithmetic is remembered): 512 x 8 workers, window 4096, ~4 s on a
  loaded 2-core VM.

The dataset's side, in call order, on every rank::

    plan = plan_epoch(index.sample_counts(), seed=seed, epoch=epoch,
                      topology=Topology(world_size, num_workers, batch_size),
                      sampling=Sampling(Shuffle(window=256), policy="pad"), resume=state)

then in each DataLoader worker ``for win in plan.stream(rank, worker_id).windows()``: fetch
``win.spans``, keep the samples of ``win.runs``, yield them in ``win.order``; the training loop
counts the batches it took, ``C``, and checkpoints ``plan.state_dict(C)``
(:meth:`EpochPlan.positions` gives the exact per-worker positions behind it). A new epoch starts
with ``resume=None``. :meth:`EpochPlan.check` verifies invariants 1-2 from the runs alone.

A state whose fingerprint or epoch differs from the plan's raises
:class:`~streamio.errors.StateMismatchError` naming each difference. A state is untrusted input (it
may come from a checkpoint file): before a stage is replayed, its sizes are bounded (``world_size``
<= 2**20, ``num_workers`` <= 1024, their product <= 2**20 streams, ``batch_size`` <= 2**24, at most
256 stages, ``epoch`` < 2**31; :mod:`~streamio.data.plan.config`), its ``world_size`` may exceed the
stage's samples only up to 4,096 ranks, and no rank may have consumed more batches than the stage
has; memory then stays O(streams) of a real topology. The errors name the field and its value.

Why it is exact: every sample of S is at one position of the padded/truncated sequence, each
position belongs to exactly one rank block, each block position to exactly one worker block and to
exactly one window slot; all maps are bijections except the two stated tail maps. Consumption
``C`` batches per rank maps to a prefix of each worker's stream (round-robin), so "consumed" and
"remaining" partition every stream.

Token data sets packed into fixed-length sequences have their own plan, over token positions
instead of samples: :func:`~streamio.data.plan.plan_packing` (:mod:`~streamio.data.plan.packing`,
over :mod:`~streamio.data.plan.tokens`), whose resume state is one int.

The design: docs/design.md "The planner"; the map of this package's modules:
docs/design.md "Layout and the direction of dependencies".
"""

from streamio.data.plan.config import Sampling, Shuffle, TailPolicy, Topology
from streamio.data.plan.epoch import EpochPlan, plan_epoch
from streamio.data.plan.mixture import PlanSource, contributions
from streamio.data.plan.packing import Pack, PackPlan, plan_packing
from streamio.data.plan.resume import STATE_VERSION
from streamio.data.plan.stream import Run, Window, WorkerStream

__all__ = [
    "STATE_VERSION",
    "EpochPlan",
    "Pack",
    "PackPlan",
    "PlanSource",
    "Run",
    "Sampling",
    "Shuffle",
    "TailPolicy",
    "Topology",
    "Window",
    "WorkerStream",
    "contributions",
    "plan_epoch",
    "plan_packing",
]
