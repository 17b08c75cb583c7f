"""Stopping a command: the abort request, the watchdog, and what a stopped command left.

Golden twin: docs/protocol.md section 10 and spec: ``spec.STOP_FIELDS`` (the STOPPED word),
``spec.LINK_STATUS`` (the command's answer: ``ok``, ``aborted``, ``watchdog``). A command stops
before its end

- on an abort (CONTROL_ABORT), unless it has written a weight: then it runs to its end, so
  that an abort never leaves a training step half applied;
- when it has run ``watchdog`` cycles, at once, in its cycle ``watchdog + 1`` (its first busy
  cycle is cycle 1), wherever it is; STOPPED then says what it left: whether it had written
  weights and, if it had, which layer it was in.

The model backend has no clock: its commands are never stopped (STOPPED reads 0, the answer
is always ``ok``).

`CommandStop(build)`: the watchdog is the build's ``watchdog`` unit (spec.FEATURES); a build
without it (the iCEBreaker) has no down-counter, and only an abort stops a command (and with
no ``abort`` unit, the register bank never raises ``abort``: nothing stops one).

Ports (sync domain):

  start:        In(1) -- a command starts (the sequencer is idle and CONTROL started one):
                the abort request, the weight flag and STOPPED are cleared, the watchdog
                loaded with ``watchdog``.
  rearm:        In(1) -- (resident data) a batch of an EPOCH or EVALUATE command starts
                the core: the watchdog is loaded with ``watchdog`` again, so its limit is
                per core run (the abort request and the weight flag are the command's and
                stay).
  busy:         In(1) -- a command runs (from the cycle after ``start``).
  counting:     In(1), 1 unless driven -- the cycles the watchdog counts: ``busy`` but
                between a resident command's core runs (the gather between them takes a
                bounded time that no register value can stretch: ember_hw.epoch).
  abort:        In(1) -- CONTROL_ABORT was written (RegisterBank.abort); held as a request
                until the next ``start``.
  weight_write: In(1) -- the command writes a weight this cycle (UpdateUnit.wr_en).
  layer:        In(range(max_layers + 1)) -- the sequencer's current layer.
  watchdog:     In -- the ``watchdog`` setting (Build.settings()'s width).
  stop:         Out(1) -- stop the command in this cycle (combinational; only while ``busy``):
                the engine leaves busy and resets its units in the next cycle.
  stopped:      Out -- STOPPED's value (spec.STOP_FIELDS), registered with ``stop``, held until
                the next ``start``.
  cmd_status:   Out -- the last command's answer for the bus (ember_hw.bus ``cmd_status``):
                LINK_STATUS ``ok``, ``aborted`` or ``watchdog``, from ``stopped``.

Timing: an abort written in cycle a stops the command in cycle a + 1 (the request is
registered), or never if the command writes a weight in or before that cycle. With the
watchdog, a command whose ``start`` is in cycle s stops in cycle s + watchdog + 1.
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ember import spec

from .bus import BusSignature


class CommandStop(wiring.Component):
    """Decide when a running command stops, and record why (module docstring)."""

    def __init__(self, build=spec.DEFAULT_BUILD):
        self.build = build
        self.has_watchdog = "watchdog" in build.features
        super().__init__({
            "start": In(1),
            "rearm": In(1),
            "busy": In(1),
            "counting": In(1, init=1),
            "abort": In(1),
            "weight_write": In(1),
            "layer": In(range(build.max_layers + 1)),
            "watchdog": In(build.settings()["watchdog"].bits),
            "stop": Out(1),
            "stopped": Out(max(lo + bits for lo, bits in spec.STOP_FIELDS.values())),
            "cmd_status": Out(BusSignature().members["cmd_status"].shape),
        })

    def elaborate(self, platform):
        m = Module()
        code = spec.LINK_STATUS
        stopped = self.stopped
        cycles_left = Signal.like(self.watchdog)    # cycles the command may still run
        expired = Signal()                      # it has run `watchdog` cycles (never without
        #                                         the unit: only an abort stops)
        abort_req = Signal()
        weights_touched = Signal()              # it has written a weight
        with m.If(self.start):
            m.d.sync += [abort_req.eq(0), weights_touched.eq(0), stopped.eq(0)]
            if self.has_watchdog:
                m.d.sync += [cycles_left.eq(self.watchdog), expired.eq(0)]
        if self.has_watchdog:
            with m.Elif(self.rearm):
                m.d.sync += [cycles_left.eq(self.watchdog), expired.eq(0)]
            with m.Elif(self.busy & self.counting):
                m.d.sync += [cycles_left.eq(cycles_left - 1), expired.eq(cycles_left == 1)]
        with m.If(self.abort):
            m.d.sync += abort_req.eq(1)
        with m.If(self.weight_write):
            m.d.sync += weights_touched.eq(1)
        m.d.comb += self.stop.eq(self.busy & (expired | (abort_req & ~weights_touched &
                                                         ~self.weight_write)))
        changed = weights_touched | self.weight_write
        fields = {"stopped": 1, "watchdog": expired, "weights_changed": changed,
                  "layer": Mux(changed, self.layer, 0)}
        stop_word = Const(0, len(stopped))
        for name, (lo, bits) in spec.STOP_FIELDS.items():
            stop_word = stop_word | (Cat(fields[name])[:bits] << lo)
        with m.If(self.stop):
            m.d.sync += stopped.eq(stop_word)
        # the last command's outcome, from STOPPED (held until the next command starts)
        field = {name: stopped[lo] for name, (lo, _) in spec.STOP_FIELDS.items()}
        m.d.comb += self.cmd_status.eq(Mux(field["stopped"],
                                           Mux(field["watchdog"], code["watchdog"],
                                               code["aborted"]),
                                           code["ok"]))
        return m
