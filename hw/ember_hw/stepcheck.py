"""The command check: a train or infer command is checked against the build before it starts.

Golden twin: ``ember.spec.check_command``, which the model backend (``ember.virtual``) runs on
the same registers. Both make the checks of ``spec.COMMAND_CHECKS`` in the same order and name
the same first failure, so a command the model refuses the engine refuses too, with the same
REJECTED value. The host checks everything before it writes (``spec.check_network``); this
unit is for a host that does not, so that no value on the link can make the engine run past
a memory or hang (issue 15).

It is built small (the iCE40UP5K has few cells to spare): no multiplier and no stored bases.
It walks the layer descriptors once, from the input side, reading four fields of each
(inputs, outputs, weight base, activation base) through the descriptor memory's read port.
Two running ends, where the layers so far end in the weight memory and in the activation
memory, are compared with each base as it arrives (a layer starts where the one below ends),
then advanced by repeated addition: the weight end by the layer's inputs once per block of
outputs, the activation end by its inputs once per sample. Each addition is checked against
the memory's size, so neither end grows past size + one layer width. At the end the two
registers count 2 x the widest blocks and the widest hidden layer once per sample, for the
gradient memory and the dX scratch. A command takes ``blocks + batch + 6`` cycles per layer
plus ``batch + 3`` of checking before it starts (tests/test_stepcheck.py measures them); the
engine's cycle counters do not see them (the sequencer starts after the check).
"""

from amaranth import Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ember import spec

CHECK_INDEX = {name: i + 1 for i, name in enumerate(spec.COMMAND_CHECKS)}


class StepCheck(wiring.Component):
    """Checks the configured command against the build (module docstring).

    build: spec.Build -- its memory sizes are the limits; desc_depth, desc_bits: the register
    bank's descriptor memory (words, width).

    Ports (sync domain):

      start:      In(1) -- check now: train, batch, layers and labels_ok are sampled in this
                  cycle and must hold until done.
      train:      In(1) -- the command trains (the labels check applies).
      batch, layers: In -- the registers.
      labels_ok:  In(1) -- every label word the batch needs has been written since the class
                  count last changed.
      desc_addr:  Out -- the descriptor word to read; desc_data: In -- the word at the
                  desc_addr of the cycle before (the memory's synchronous read port).
      busy:       Out(1) -- checking (the unit owns the descriptor read port).
      done:       Out(1) -- the verdict, for one cycle.
      failed:     Out -- with done: 0 if the command passed, else 1 + the index of the failed
                  check in spec.COMMAND_CHECKS.
    """

    def __init__(self, build, desc_depth, desc_bits):
        self.build = build
        settings = build.settings()
        self.width_bits = build.descriptor_fields()["inputs"].bits
        super().__init__({
            "start": In(1),
            "train": In(1),
            "batch": In(settings["batch"].bits),
            "layers": In(settings["layers"].bits),
            "labels_ok": In(1),
            "desc_addr": Out(range(desc_depth)),
            "desc_data": In(desc_bits),
            "busy": Out(1),
            "done": Out(1),
            "failed": Out(range(len(spec.COMMAND_CHECKS) + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        bld = self.build
        P = bld.lanes
        logp = P.bit_length() - 1
        max_blocks = bld.blocks(bld.max_width)

        layer = Signal(range(bld.max_layers + 1))
        field = Signal(range(4 + 1))        # the field whose word arrives this cycle, + 1
        k = Signal(self.width_bits)
        n = Signal(self.width_bits)
        prev_n = Signal(self.width_bits)
        blocks = Signal(range(max_blocks + 1))
        m.d.comb += blocks.eq((n + (P - 1)) >> logp)
        widest_blocks = Signal(range(max_blocks + 1))
        widest_hidden = Signal(self.width_bits)
        # base mismatches, noted as the bases arrive and reported in the checks' order
        weights_moved = Signal()
        acts_moved = Signal()
        # the running ends; at the end, the gradient words and dX entries of the batch
        weights_end = Signal(range(max(bld.weight_words, bld.grad_words) + 2 * max_blocks + 1))
        acts_end = Signal(range(max(bld.act_bytes, bld.scratch_entries) + bld.max_width + 1))
        grads_over = Signal()
        scratch_over = Signal()
        reps = Signal(range(max(max_blocks, bld.max_batch) + 1))

        samples = Const(int(bld.dataflow == "samples"), 1)

        def fail(name):
            return [self.done.eq(1), self.failed.eq(CHECK_INDEX[name])]

        m.d.comb += self.desc_addr.eq(layer * spec.LAYER_STRIDE + field)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    with m.If(self.layers == 0):
                        m.d.comb += fail("layers")
                    with m.Elif(self.batch == 0):
                        m.d.comb += fail("batch")
                    with m.Else():
                        m.d.sync += [layer.eq(0), field.eq(0), weights_end.eq(0),
                                     acts_end.eq(0), widest_blocks.eq(0), widest_hidden.eq(0)]
                        m.next = "READ"
            with m.State("READ"):
                # field f's address in one cycle, its word in the next
                m.d.comb += self.busy.eq(1)
                m.d.sync += field.eq(field + 1)
                with m.Switch(field):
                    with m.Case(1):
                        m.d.sync += k.eq(self.desc_data)
                    with m.Case(2):
                        m.d.sync += n.eq(self.desc_data)
                    with m.Case(3):
                        m.d.sync += weights_moved.eq(self.desc_data != weights_end)
                    with m.Case(4):
                        m.d.sync += acts_moved.eq(self.desc_data != acts_end)
                        m.next = "LAYER"
            with m.State("LAYER"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += reps.eq(blocks)
                with m.If((layer != 0) & (k != prev_n)):
                    m.d.comb += fail("chain")
                    m.next = "IDLE"
                with m.Elif(weights_moved & ~samples):
                    m.d.comb += fail("weights")
                    m.next = "IDLE"
                with m.Elif(samples):
                    # engine v2: the program says where everything is, and the core checks
                    # every address it forms (spec.check_command): the next layer
                    m.d.sync += reps.eq(0)
                    m.next = "ACTS"
                with m.Else():
                    m.next = "WEIGHTS"
            with m.State("WEIGHTS"):
                # the weight end advances by K per block of outputs
                m.d.comb += self.busy.eq(1)
                with m.If(weights_end > bld.weight_words):
                    m.d.comb += fail("weights")
                    m.next = "IDLE"
                with m.Elif(reps != 0):
                    m.d.sync += [weights_end.eq(weights_end + k), reps.eq(reps - 1)]
                with m.Elif(acts_moved):
                    m.d.comb += fail("acts")
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += reps.eq(self.batch)
                    m.next = "ACTS"
            with m.State("ACTS"):
                # the activation end advances by K per sample
                m.d.comb += self.busy.eq(1)
                last = layer == self.layers - 1
                with m.If(acts_end > bld.act_bytes):
                    m.d.comb += fail("acts")
                    m.next = "IDLE"
                with m.Elif(reps != 0):
                    m.d.sync += [acts_end.eq(acts_end + k), reps.eq(reps - 1)]
                with m.Else():
                    m.d.sync += [prev_n.eq(n), field.eq(0), layer.eq(layer + 1)]
                    with m.If((blocks > widest_blocks) & ~samples):
                        m.d.sync += widest_blocks.eq(blocks)
                    with m.If(~last & (n > widest_hidden) & ~samples):
                        m.d.sync += widest_hidden.eq(n)
                    with m.If(last):
                        m.next = "CLASSES"
                    with m.Else():
                        m.next = "READ"
            with m.State("CLASSES"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += [weights_end.eq(0), acts_end.eq(0), grads_over.eq(0),
                             scratch_over.eq(0), reps.eq(self.batch)]
                with m.If(prev_n < 2):
                    m.d.comb += fail("classes")
                    m.next = "IDLE"
                with m.Else():
                    m.next = "BATCH"
            with m.State("BATCH"):
                # per sample: 2 x the widest blocks of gradient words, the widest hidden
                # layer's dX entries (each sum stops once past its memory)
                m.d.comb += self.busy.eq(1)
                with m.If(reps != 0):
                    m.d.sync += reps.eq(reps - 1)
                    with m.If(weights_end > bld.grad_words):
                        m.d.sync += grads_over.eq(1)
                    with m.Else():
                        m.d.sync += weights_end.eq(weights_end + 2 * widest_blocks)
                    with m.If(acts_end > bld.scratch_entries):
                        m.d.sync += scratch_over.eq(1)
                    with m.Else():
                        m.d.sync += acts_end.eq(acts_end + widest_hidden)
                with m.Elif(grads_over | (weights_end > bld.grad_words)):
                    m.d.comb += fail("grads")
                    m.next = "IDLE"
                with m.Elif(scratch_over | (acts_end > bld.scratch_entries)):
                    m.d.comb += fail("scratch")
                    m.next = "IDLE"
                with m.Elif(self.train & ~self.labels_ok):
                    m.d.comb += fail("labels")
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += [self.done.eq(1), self.failed.eq(0)]
                    m.next = "IDLE"
        return m



class CountCheck(StepCheck):
    """The check of a build without the command_check unit (the iCEBreaker's, for lack of
    logic cells; docs/boards.md): only "layers" and "batch", in the cycle of the command, so
    that no command can hang (a command on 0 layers or 0 samples would never finish; widths
    cannot be 0: descriptor fields refuse 0 and start at 1). Same ports as StepCheck; busy
    stays low. The model backend still refuses whatever spec.check_command refuses."""

    def elaborate(self, platform):
        m = Module()
        with m.If(self.start):
            m.d.comb += self.done.eq(1)
            with m.If(self.layers == 0):
                m.d.comb += self.failed.eq(CHECK_INDEX["layers"])
            with m.Elif(self.batch == 0):
                m.d.comb += self.failed.eq(CHECK_INDEX["batch"])
        return m
