"""The engine's internal register/memory bus: word-addressed request/acknowledge.

The link bridge (the master) turns host frames into bus transactions; the engine (the slave)
maps its registers, counters and memories into one word address space (see
ember.spec.ADDRESS_MAP). One transaction at a time:

- the master drives ``addr`` and, for a write, ``w_data``, and raises ``w_stb`` or ``r_stb``;
  it holds them until the slave answers;
- the slave answers in any later cycle with ``ack`` for one cycle (``r_data`` valid in that cycle
  for a read) or with ``err`` for one cycle, the low ``spec.LINK_STATUS_BITS`` bits of
  ``r_data`` then holding an error code (ember.spec.LINK_STATUS: out of range, busy, bad value);
- the master drops its strobe in the cycle after the answer.

Commands (docs/protocol.md section 10): a write that starts a train or infer command is
acknowledged at once with ``defer`` high: the command runs, the bus is free for other accesses
(STATUS, an abort), and the write's outcome comes later: ``cmd_done`` high for one cycle when
the command has ended, ``cmd_status`` (a LINK_STATUS code: ``ok``, ``aborted``, ``watchdog``)
valid in that cycle. Until the master has passed that outcome on, it holds ``owing`` high,
and the slave starts no other command.
"""

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ember import spec


class BusSignature(wiring.Signature):
    """Master-side view of the bus (flip it for the slave)."""

    def __init__(self, addr_width=spec.BUS_ADDR_BITS, data_width=spec.BUS_DATA_BITS):
        super().__init__({
            "addr": Out(addr_width),
            "w_data": Out(data_width),
            "w_stb": Out(1),
            "r_stb": Out(1),
            "ack": In(1),
            "err": In(1),
            "r_data": In(data_width),
            "owing": Out(1),
            "defer": In(1),
            "cmd_done": In(1),
            "cmd_status": In(spec.LINK_STATUS_BITS),
        })


def answer_ok(slave, data=None):
    """Statements that answer the access on `slave`'s answer signals (`ack`, `data`: a
    register bank or memory window) `ok`, with `data` for a read."""
    stmts = [slave.ack.eq(1)]
    if data is not None:
        stmts.append(slave.data.eq(data))
    return stmts


def answer_error(slave, status):
    """Statements that answer the access on `slave` with the error `status`
    (a spec.LINK_STATUS name) on its `err` and `data`."""
    return [slave.err.eq(1), slave.data.eq(spec.LINK_STATUS[status])]


def engine_members():
    """The ports of an engine behind the bus (EngineCore, v1; SampleCore, v2), which
    EngineTop connects: the bus, one pulse per link byte received and sent (counted), and
    busy (a command is running)."""
    return {"bus": In(BusSignature()), "link_rx": In(1), "link_tx": In(1), "busy": Out(1)}
