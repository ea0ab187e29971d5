"""The measured data-pipeline trial of ``benchmarks/bench_pipeline.py``, run in every contender's environment.

The same file runs in streamio's virtual environment (``benchmarks.peer_pipeline``, for streamio,
webdataset and the in-memory ceiling) and in the peers' own (``.venv-peers/mosaicml``,
``.venv-peers/litdata``, as a script): it imports neither streamio nor the rest of ``benchmarks``,
only the stdlib, torch, numpy, PIL and, inside the functions that need it, the peer library.

Why a fork server. ``import torch`` plus a peer library costs 4-10 s of CPU on these machines,
more than a warm 1 GB epoch; paying it once per trial would crowd the trials out of the time
budget. :func:`serve` imports once and forks a fresh child per trial: the child's
``getrusage(RUSAGE_SELF)`` starts at zero, it holds no state of an earlier trial (indexes, shared
memory, caches, threads), and its DataLoader workers are its own children, reaped at the end of
the epoch, so ``RUSAGE_CHILDREN`` holds their CPU when the trial ends. The protocol: one JSON op
per stdin line, one ``RESULT {json}`` line back on stdout (``{"error": traceback}`` on failure):

* ``{"op": "trial", "loader": NAME, ...}``: :func:`run_trial` with ``makers[NAME]``;
* ``{"op": "write", "format": "mds" | "litdata", "src": DIR, "out": DIR, "data": "bin" | "jpg", ...}``:
  the tar shards in ``src`` (streamio's, read with the stdlib ``tarfile``) rewritten in the peer's format;
* ``{"op": "versions"}``: the versions of the libraries this environment measures with.

Samples. Raw: ``KEY.bin`` (random bytes) + ``KEY.cls`` (a class number as text). Image: ``KEY.jpg``
+ ``KEY.cls``; every contender applies :func:`decode_resize` in its DataLoader workers (PIL decode,
resize to 224 x 224, uint8 HWC tensor), the same function everywhere.
"""

from __future__ import annotations

import gc
import io
import json
import os
import resource
import sys
import tarfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

IMAGE_SIDE = 224

Build = Callable[[], Iterable[Mapping[str, Any]]]
"""Builds the dataset and loader of one trial (timed: part of the start-up)."""
Maker = Callable[[Mapping[str, Any]], Build]
"""Untimed preparation of a trial (e.g. the in-memory samples of the ceiling); returns its :data:`Build`."""


# ----------------------------------------------------------------------------- the image transform
def decode_resize(buf: Any) -> Any:
    """JPEG bytes (or any buffer) -> a ``224 x 224 x 3`` uint8 tensor: PIL decode and bilinear resize."""
    import numpy as np
    import torch
    from PIL import Image

    with Image.open(io.BytesIO(buf)) as im:
        small = im.convert("RGB").resize((IMAGE_SIDE, IMAGE_SIDE), Image.BILINEAR)
    return torch.from_numpy(np.array(small))


def image_sample(key: str, jpg: Any, cls: Any) -> dict[str, Any]:
    """The sample every contender's workers hand to collation: key, decoded image, class number."""
    return {"__key__": key, "image": decode_resize(jpg), "cls": int(cls)}


def image_from_tar_sample(sample: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`image_sample` of a WebDataset-style sample (``__key__``, ``jpg``, ``cls`` bytes)."""
    return image_sample(sample["__key__"], sample["jpg"], sample["cls"])


# ----------------------------------------------------------------------------- the samples, from tar shards
def shard_paths(directory: str) -> list[str]:
    """The ``.tar`` shards of a streamio data set directory, in index order (their names sort)."""
    return sorted(str(p) for p in Path(directory).glob("*.tar"))


def tar_samples(path: str) -> Iterator[dict[str, Any]]:
    """The samples of one tar shard: consecutive members ``KEY.EXT`` grouped by key, ``__key__`` + ext -> bytes."""
    sample: dict[str, Any] = {}
    with tarfile.open(path) as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, _, ext = member.name.partition(".")
            if sample and sample["__key__"] != key:
                yield sample
                sample = {}
            f = tar.extractfile(member)
            assert f is not None, member.name
            sample.setdefault("__key__", key)
            sample[ext] = f.read()
    if sample:
        yield sample


def all_samples(directory: str) -> Iterator[dict[str, Any]]:
    for path in shard_paths(directory):
        yield from tar_samples(path)


# ----------------------------------------------------------------------------- writing the peers' formats
def write_mds(src: str, out: str, data: str, size_limit: int) -> dict[str, Any]:
    """``src``'s samples as MDS (columns ``key: str``, ``DATA: bytes``, ``cls: int``; no compression)."""
    from streaming import MDSWriter

    n = 0
    with MDSWriter(out=out, columns={"key": "str", data: "bytes", "cls": "int"}, size_limit=size_limit) as writer:
        for s in all_samples(src):
            writer.write({"key": s["__key__"], data: s[data], "cls": int(s["cls"])})
            n += 1
    return {"samples": n, "files": len(os.listdir(out))}


def _litdata_items(path: str, data: str) -> Iterator[dict[str, Any]]:
    """One shard's samples for ``litdata.optimize``: blobs as uint8 arrays (litdata collates bytes per byte)."""
    import numpy as np

    for s in tar_samples(path):
        yield {"key": s["__key__"], data: np.frombuffer(s[data], dtype=np.uint8), "cls": int(s["cls"])}


def write_litdata(src: str, out: str, data: str, chunk_bytes: int) -> dict[str, Any]:
    """``src``'s samples as a litdata data set (``optimize``, one input per tar shard, forked worker)."""
    from litdata import optimize

    optimize(fn=partial(_litdata_items, data=data), inputs=shard_paths(src), output_dir=out, chunk_bytes=chunk_bytes,
             num_workers=1, mode="overwrite", start_method="fork")
    return {"files": len(os.listdir(out))}


def write(op: Mapping[str, Any]) -> dict[str, Any]:
    if op["format"] == "mds":
        return write_mds(op["src"], op["out"], op["data"], op["shard_bytes"])
    if op["format"] == "litdata":
        return write_litdata(op["src"], op["out"], op["data"], op["shard_bytes"])
    raise ValueError(f"unknown format {op['format']!r}; expected mds or litdata")


# ----------------------------------------------------------------------------- loaders of this file
def make_webdataset(cfg: Mapping[str, Any]) -> Build:
    """``wds.WebDataset(urls, shardshuffle=False)`` (+ ``.map`` of the image transform) + ``wds.WebLoader``."""
    import webdataset as wds

    urls = shard_paths(cfg["dir"])

    def build() -> Iterable[Mapping[str, Any]]:
        ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        if cfg.get("image"):
            ds = ds.map(image_from_tar_sample)
        return wds.WebLoader(ds, batch_size=cfg["batch_size"], num_workers=cfg["workers"])

    return build


def make_mosaicml(cfg: Mapping[str, Any]) -> Build:
    """mosaicml-streaming ``StreamingDataset(local=DIR)`` (no remote) + a torch ``DataLoader``."""
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    class ImageDataset(StreamingDataset):  # mosaicml's documented way to transform: override __getitem__
        def __getitem__(self, i: int) -> Any:
            s = super().__getitem__(i)
            return image_sample(s["key"], s["jpg"], s["cls"])

    cls = ImageDataset if cfg.get("image") else StreamingDataset

    def build() -> Iterable[Mapping[str, Any]]:
        ds = cls(local=cfg["dir"], remote=None, batch_size=cfg["batch_size"], shuffle=False)
        return DataLoader(ds, batch_size=cfg["batch_size"], num_workers=cfg["workers"])

    return build


def _litdata_image(item: Mapping[str, Any]) -> dict[str, Any]:
    return image_sample(item["key"], item["jpg"], item["cls"])


def make_litdata(cfg: Mapping[str, Any]) -> Build:
    """litdata ``StreamingDataset(DIR)`` (a local directory: read in place) + its ``StreamingDataLoader``."""
    from litdata import StreamingDataLoader, StreamingDataset

    def build() -> Iterable[Mapping[str, Any]]:
        ds = StreamingDataset(cfg["dir"], transform=_litdata_image if cfg.get("image") else None)
        return StreamingDataLoader(ds, batch_size=cfg["batch_size"], num_workers=cfg["workers"])

    return build


def make_memory(cfg: Mapping[str, Any]) -> Build:
    """The ceiling: a torch ``DataLoader`` over samples already in memory (bytes built before the clock starts).

    An ``IterableDataset`` whose worker ``k`` of ``n`` yields samples ``k, k + n, ...``: what is
    left is the DataLoader's own cost (worker start, collation, pickling batches to the main
    process) and, for images, the transform.
    """
    import itertools

    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    samples = list(all_samples(cfg["dir"]))
    gc.freeze()  # the collector never walks (so never copies-on-write) the samples in the workers
    image = bool(cfg.get("image"))

    class InMemory(IterableDataset):
        def __iter__(self) -> Iterator[Mapping[str, Any]]:
            info = get_worker_info()
            k, n = (info.id, info.num_workers) if info is not None else (0, 1)
            for s in itertools.islice(samples, k, None, n):
                yield image_from_tar_sample(s) if image else s

    return lambda: DataLoader(InMemory(), batch_size=cfg["batch_size"], num_workers=cfg["workers"])


MAKERS: dict[str, Maker] = {"webdataset": make_webdataset, "mosaicml": make_mosaicml, "litdata": make_litdata,
                            "memory": make_memory}


# ----------------------------------------------------------------------------- the measured trial
def _cpu() -> tuple[float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def run_trial(make: Maker, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """One epoch of ``make(cfg)``'s loader, timed from building the dataset to the last batch.

    Returns samples and distinct keys (the driver checks both against the data set), wall time,
    start-up (building the dataset to the first batch), and CPU seconds of this process and of its
    reaped children (the DataLoader workers) over the same span.
    """
    import multiprocessing

    build = make(cfg)
    gc.collect()
    key = cfg.get("key", "__key__")
    load = os.getloadavg()[0]
    cpu0 = _cpu()
    t0 = time.perf_counter()
    loader = build()
    n, keys, first, batch = 0, set(), None, None
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t0
        n += len(batch[key])
        keys.update(batch[key])
    wall = time.perf_counter() - t0
    del loader, batch
    for child in multiprocessing.active_children():  # the DataLoader joined its workers; anything else is reaped
        child.join(30)
    left = len(multiprocessing.active_children())
    cpu1 = _cpu()
    return {"samples": n, "distinct": len(keys), "wall_s": wall, "first_batch_s": first or 0.0,
            "cpu_main_s": cpu1[0] - cpu0[0], "cpu_workers_s": cpu1[1] - cpu0[1], "children_left": left,
            "loadavg_1m": load}


# ----------------------------------------------------------------------------- the fork server
def versions() -> dict[str, str]:
    """The versions of the libraries importable here (measured with), by distribution name."""
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for dist in ("torch", "numpy", "pillow", "webdataset", "mosaicml-streaming", "litdata"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def _in_child(op: Mapping[str, Any], makers: Mapping[str, Maker]) -> dict[str, Any]:
    if op["op"] == "trial":
        return run_trial(makers[op["loader"]], op)
    if op["op"] == "write":
        return write(op)
    raise ValueError(f"unknown op {op['op']!r}")


def _fork(op: Mapping[str, Any], makers: Mapping[str, Maker]) -> dict[str, Any]:
    """Run ``op`` in a forked child; its JSON result through a pipe (the child's stdout goes to stderr)."""
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        os.dup2(2, 1)  # library output must not reach the protocol
        try:
            res = _in_child(op, makers)
        except BaseException:  # noqa: BLE001 - reported to the driver, which raises
            res = {"error": traceback.format_exc()}
        gc.collect()  # finalizers (e.g. shared memory) run before the child leaves
        with os.fdopen(w, "w") as f:
            f.write(json.dumps(res))
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    _, status = os.waitpid(pid, 0)
    return json.loads(text) if text else {"error": f"the trial process exited with status {status} and no result"}


def serve(makers: Mapping[str, Maker]) -> None:
    """The fork server (see the module docstring): ops on stdin, ``RESULT {json}`` lines on stdout."""
    for line in sys.stdin:
        op = json.loads(line)
        try:
            res = versions() if op["op"] == "versions" else _fork(op, makers)
        except Exception:  # noqa: BLE001 - reported to the driver, which raises
            res = {"error": traceback.format_exc()}
        print("RESULT " + json.dumps(res), flush=True)


def main() -> None:
    if sys.argv[1:] != ["serve"]:
        sys.exit("usage: python benchmarks/peer_pipeline.py serve   (driven by benchmarks/bench_pipeline.py)")
    os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")
    for module in ("torch", "numpy", "PIL.Image", "streaming", "litdata", "webdataset"):  # import once, not per trial
        try:
            __import__(module)
        except ImportError:
            pass
    serve(MAKERS)


if __name__ == "__main__":
    main()
