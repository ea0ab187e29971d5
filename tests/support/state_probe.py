"""Child process of tests/data/test_state_bounds.py: loads hostile data positions under a memory cap.

``python state_probe.py URL claims`` loads the states of issue 23 (a world size of 10**9, 10**8
workers, ...) one by one; ``python state_probe.py URL fuzz N`` runs N hypothesis examples, each a
valid state with one field replaced (huge, negative, float, bool, wrong type) or removed, through
every way a position is loaded (the dataset, StreamingDataLoader, torchdata's StatefulDataLoader
with 0 and 2 workers). Before loading, the process caps its address space (RLIMIT_AS) at its size
plus 1 GiB, so a state that makes the planner allocate for its claims fails here with a
MemoryError instead of taking the machine's memory. Each load must end as accepted or as a
StreamioError, within SECONDS and with a traced peak under PEAK_BYTES. Exit status 0 = all held;
the failures are printed.
"""

from __future__ import annotations

import copy
import os
import resource
import sys
import time
import tracemalloc
import warnings
from collections.abc import Callable
from typing import Any

warnings.simplefilter("ignore")  # torch's DataLoader worker-count advice on a 2-CPU machine

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

from streamio.data.dataset import StreamingDataset  # noqa: E402
from streamio.data.loader import StreamingDataLoader  # noqa: E402
from streamio.errors import StreamioError  # noqa: E402

CAP = 1 << 30
SECONDS = 5.0
PEAK_BYTES = 192 << 20
Path = tuple[Any, ...]


def cap_address_space(extra: int) -> None:
    """Limit this process's address space to its current size plus ``extra`` bytes."""
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (size + extra, resource.getrlimit(resource.RLIMIT_AS)[1]))


def valid_states(url: str) -> dict[str, tuple[Callable[[], Callable[[Any], None]], Any]]:
    """Name -> (a fresh loader of states, a valid state for it)."""
    ds = StreamingDataset(url, batch_size=4)
    StreamingDataLoader(ds, num_workers=2)
    one = ds.state_after(3)
    other = StreamingDataset(url, batch_size=4)
    other.load_state_dict(one)
    two_stages = other.state_after(1)
    worker = {"version": 1, "epoch": 0, "plan": one["plan"], "worker": 1, "yielded": 4}
    workers = {
        "_snapshot": {"_worker_snapshots": {"worker_0": {"dataset_state": {**worker, "worker": 0}},
                                            "worker_1": {"dataset_state": worker}}},
        "_iterator_finished": False,
    }
    main = {"_num_yielded": 2, "dataset_state": two_stages, "_iterator_finished": False}

    def dataset() -> Callable[[Any], None]:
        return StreamingDataset(url, batch_size=4).load_state_dict

    def streaming() -> Callable[[Any], None]:
        return StreamingDataLoader(StreamingDataset(url, batch_size=4), num_workers=2).load_state_dict

    def stateful(n: int) -> Callable[[], Callable[[Any], None]]:
        def new() -> Callable[[Any], None]:
            return StatefulDataLoader(StreamingDataset(url, batch_size=4), batch_size=4, num_workers=n).load_state_dict

        return new

    return {
        "dataset": (dataset, one),
        "dataset-two-stages": (dataset, two_stages),
        "dataset-worker": (dataset, worker),
        "streaming-loader": (streaming, {"version": 1, "dataset": one}),
        "stateful-0": (stateful(0), main),
        "stateful-2": (stateful(2), workers),
    }


def paths(obj: Any, prefix: Path = ()) -> list[Path]:
    """Every place in ``obj`` (dict keys and list items, recursively), the root excluded."""
    out: list[Path] = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        out.append((*prefix, key))
        out += paths(value, (*prefix, key))
    return out


_DROP = object()


def mutate(state: Any, path: Path, value: Any) -> Any:
    out = copy.deepcopy(state)
    holder = out
    for key in path[:-1]:
        holder = holder[key]
    if value is _DROP and isinstance(holder, dict):
        del holder[path[-1]]
    else:
        holder[path[-1]] = None if value is _DROP else value
    return out


def attempt(load: Callable[[Any], None], state: Any) -> tuple[str, float, int]:
    """Load ``state``: ``("accepted" | error class: message, seconds, traced peak bytes)``."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        load(state)
        outcome = "accepted"
    except StreamioError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    finally:
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return outcome, seconds, peak


# the claims of issue 23: (case, path in the state, value); each must be refused naming field and value
CLAIMS: list[tuple[str, Path, Any]] = [
    ("dataset", ("plan", "stages", 0, "world_size"), 10**9),
    ("dataset", ("plan", "stages", 0, "world_size"), 10**6),
    ("dataset", ("plan", "stages", 0, "num_workers"), 10**8),
    ("dataset", ("plan", "stages", 0, "batch_size"), 10**12),
    ("dataset", ("plan", "stages", 0, "batches"), 10**15),
    ("dataset", ("epoch",), 1 << 40),
    ("dataset-two-stages", ("plan", "stages", 1, "world_size"), 10**9),
    ("dataset-worker", ("yielded",), 10**12),
    ("dataset-worker", ("worker",), 10**8),
    ("streaming-loader", ("dataset", "plan", "stages", 0, "world_size"), 10**9),
    ("stateful-0", ("dataset_state", "plan", "stages", 0, "num_workers"), 10**8),
]


def claims(url: str) -> list[str]:
    states = valid_states(url)
    cap_address_space(CAP)
    failures = []
    for case, path, value in CLAIMS:
        new, state = states[case]
        outcome, seconds, peak = attempt(new(), mutate(state, path, value))
        field = str(path[-1])
        ok = outcome.startswith("PlanError") and field in outcome and str(value) in outcome
        if not ok or seconds > SECONDS or peak > PEAK_BYTES:
            failures.append(f"{case} {path}={value}: {outcome[:300]} ({seconds:.2f} s, peak {peak >> 20} MiB)")
    return failures


HOSTILE = st.one_of(
    st.sampled_from([10**8, 10**9, 10**12, 10**18, 2**63, 2**64, 2**100, -1, -(2**63), 0, 1, 3, _DROP]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=4),
    st.lists(st.integers(min_value=-(2**65), max_value=2**65), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def fuzz(url: str, examples: int) -> list[str]:
    states = valid_states(url)
    cases = sorted(states)
    cap_address_space(CAP)
    failures: list[str] = []

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        case = data.draw(st.sampled_from(cases))
        new, state = states[case]
        path = data.draw(st.sampled_from(paths(state)))
        value = data.draw(HOSTILE)
        load = new()
        try:
            outcome, seconds, peak = attempt(load, mutate(state, path, value))
        except Exception as exc:  # not a StreamioError: the failure this test exists for
            failures.append(f"{case} {path}={value!r}: {type(exc).__name__}: {str(exc)[:200]}")
            raise
        if seconds > SECONDS or peak > PEAK_BYTES:
            failures.append(f"{case} {path}={value!r}: {outcome[:200]} took {seconds:.2f} s, peak {peak >> 20} MiB")
            raise AssertionError(failures[-1])

    try:
        prop()
    except Exception:  # noqa: BLE001 - hypothesis shrank it; the failure list says what
        pass
    return failures


def main() -> int:
    url, mode = sys.argv[1], sys.argv[2]
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    failures = claims(url) if mode == "claims" else fuzz(url, int(sys.argv[3]))
    for line in failures[:8]:
        print(line)
    if len(failures) > 8:
        print(f"... and {len(failures) - 8} more (hypothesis shrinking)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
