"""The FaultProxy's parts without a server: fault values, the fault table, the upload trigger, the body relay.

The end-to-end behaviour over real HTTP is in test_fault_proxy.py; these pin the rules each part
owns, so a change to one shows up here first and without a socket.
"""

from __future__ import annotations

import io

from streamio.testing.faults import BODY_FAULTS, CORRUPT, FAIL, RESET, TRUNCATE, Fault, FaultTable, RequestRecord
from streamio.testing.relay import PIECE, BodyRelay
from streamio.testing.upload_trigger import UploadTrigger

BODY = bytes(range(256)) * 4  # 1024 bytes, every byte value


def test_fault_apply_cuts_at_the_offset_or_flips_one_byte() -> None:
    reset = Fault(RESET, 1, offset=100)
    assert reset.apply(BODY[:64], 0) == (BODY[:64], None, False)  # ends before the cut: untouched
    assert reset.apply(BODY[64:128], 64) == (BODY[64:100], RESET, True)
    assert Fault(TRUNCATE, 1, offset=64).apply(BODY[64:128], 64) == (b"", TRUNCATE, True)
    piece, kind, stop = Fault(CORRUPT, 1, offset=70).apply(BODY[64:128], 64)
    assert (kind, stop, len(piece)) == (CORRUPT, False, 64)
    assert [i for i in range(64) if piece[i] != BODY[64 + i]] == [6] and piece[6] == BODY[70] ^ 0xFF


def test_fault_table_takes_matching_faults_in_order_and_only_for_longer_bodies() -> None:
    table = FaultTable()
    table.add(Fault(FAIL, 0))  # no use left: never in force
    table.add(Fault(RESET, 2, offset=500, method="get", path_contains="/shard"))
    table.add(Fault(CORRUPT, None, offset=10))
    assert table.take((FAIL,), "GET", "/b/shard-0") is None
    # a body not longer than the offset neither gets nor consumes the reset: the corrupt applies
    assert table.take(BODY_FAULTS, "GET", "/b/shard-0", 500).kind == CORRUPT  # type: ignore[union-attr]
    assert table.take(BODY_FAULTS, "PUT", "/b/shard-0", 501).kind == CORRUPT  # type: ignore[union-attr]
    kinds = [table.take(BODY_FAULTS, "GET", "/b/shard-0", 501).kind for _ in range(3)]  # type: ignore[union-attr]
    assert kinds == [RESET, RESET, CORRUPT]  # two uses, then gone; unlimited stays


def test_fault_table_clear_empties_the_log_in_place() -> None:
    table = FaultTable()
    log = table.requests
    table.record(RequestRecord("GET", "/b/k", "", None, 200, 0, 10))
    table.set_latency(-1)
    table.set_bandwidth(1e6)
    assert table.timing() == (0.0, 1e6) and log == table.log()
    table.clear()
    assert table.requests is log and log == [] and table.timing() == (0.0, None)


def test_upload_trigger_allows_exactly_nbytes_then_fires_once() -> None:
    trigger, fired = UploadTrigger(), []
    assert trigger.allowance(1000) == 1000 and trigger.advance(1000) is None  # unarmed: counts, never fires
    trigger.arm(150, lambda: fired.append(1))  # counting restarts here
    assert trigger.allowance(100) == 100 and trigger.advance(100) is None
    assert trigger.allowance(100) == 50
    hit = trigger.advance(50)
    assert hit is not None and hit.forward_rest is False
    hit.callback()
    assert fired == [1] and trigger.advance(10) is None and trigger.allowance(7) == 7
    trigger.arm(10, lambda: None, forward_rest=True)
    trigger.disarm()
    assert trigger.allowance(100) == 100 and trigger.advance(100) is None


def _pump(fault: Fault | None, length: int | None) -> tuple[bool, bytes, list[int], BodyRelay]:
    out = io.BytesIO()
    logged_at: list[int] = []  # bytes already written when the request was logged
    relay = BodyRelay(out.write, fault, length, None)
    ended = relay.pump(io.BytesIO(BODY * 100).read, lambda: logged_at.append(out.tell()))
    return ended, out.getvalue(), logged_at, relay


def test_body_relay_logs_before_the_last_piece_and_stops_at_a_cut() -> None:
    total = len(BODY) * 100
    ended, sent, logged_at, relay = _pump(None, total)
    assert ended and sent == BODY * 100 and logged_at == [total - total % PIECE] and relay.sent == total
    ended, sent, logged_at, relay = _pump(Fault(RESET, 1, offset=PIECE + 7), total)
    assert not ended and sent == (BODY * 100)[: PIECE + 7] and logged_at == [] and relay.kind == RESET
    ended, sent, _, relay = _pump(Fault(CORRUPT, 1, offset=PIECE), None)  # unknown length: to end of stream
    assert not ended and len(sent) == total and relay.kind == CORRUPT
    assert sent[PIECE] == BODY[PIECE % len(BODY)] ^ 0xFF and sent[: PIECE] == (BODY * 100)[:PIECE]
