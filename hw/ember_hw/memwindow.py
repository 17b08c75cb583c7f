"""The memory window: the engine's bus slave for its memory regions (weights, activations,
labels, predictions and every unmapped region; not region 0, the register bank's).

Golden twin: the memory half of ``ember.virtual.VirtualEngine`` (its ``read``/``write`` of the
regions above), which the model backend answers the host with, and ``spec.ADDRESS_MAP`` and
``spec.LINK_STATUS``: the same words, the same error codes, the same bytes written where.
While a command runs the window answers ``busy`` to every access (the model never runs one
while the host talks to it). The region layouts (spec.ADDRESS_MAP):

- weights: two 16-bit lanes per bus word, low lane first; word ``offset * 2 // P``, lanes
  ``offset * 2 % P`` and the next. Read and write; ``out_of_range`` past ``weight_words``.
- acts: four bytes per bus word, byte ``4 * offset + i`` from bits ``8i..8i+7``; a byte at or
  past the input batch's size (``act_limit``: batch * inputs of layer 0) is dropped, and
  only written bytes are counted (``act_wr_en``). Write only (a read: ``bad_value``);
  ``out_of_range`` past ``act_bytes``.
- labels: two labels per word, low first; a write with either label at or above ``classes``
  is refused (``bad_value``) and writes neither. Predictions: the same layout, read only.
  ``out_of_range`` past ``max_batch``.
- any other region but 0: ``out_of_range``.

The window's requests go to the memories' ports through the engine, which connects them
before the sequencer's own port assignments: those take over while a command runs, and the
window requests nothing while ``busy``. Each request port is 0 in a cycle that does not use
it.

`MemoryWindow(build)`: widths and sizes from the ``spec.Build`` (the memory ports' address
widths those of the engine's memories: ceil_log2 of their depths).

Ports (sync domain; the answer is combinational: the engine registers it before it reaches
the bus, see EngineCore):

  sel:            In(1) -- an access to any region but 0 is active (held until answered;
                  low in the cycle after the answer, when the engine's registered answer
                  is on the bus).
  addr:           In(BUS_ADDR_BITS) -- the bus word address (region and offset).
  write, w_data:  In(1), In(BUS_DATA_BITS) -- the access is a write of w_data.
  ack, err, data: Out(1), Out(1), Out(BUS_DATA_BITS) -- the answer, in the cycle it is
                  decided: ack (data: the word read) or err (data: a LINK_STATUS code).
  busy:           In(1) -- a command runs: every access is answered ``busy``.
  act_limit:      In -- the input batch's size in bytes (batch * inputs of layer 0), valid
                  while ``limit_ready``.
  limit_ready:    In(1) -- act_limit is valid (the engine's serial product is done and not
                  being restarted); an activation write waits until it is.
  classes:        In -- the class count labels are checked against (RegisterBank.classes).
  w_wr_addr, w_wr_data, w_wr_en: Out -- a weight write (w_wr_en: one enable per lane).
  w_rd, w_rd_addr: Out -- read weight word w_rd_addr (its data in the next cycle).
  u_word_load:    Out(1) -- the engine's u_word register takes the weight word read last
                  cycle.
  u_word_shift:   Out(1) -- u_word shifts down a lane.
  u_word_low:     In(BUS_DATA_BITS) -- u_word's two lowest lanes.
  act_wr_addr, act_wr_data, act_wr_en: Out -- an activation byte write (act_wr_en is also
                  the ``act_writes`` counter's strobe).
  label_wr_addr, label_wr_data, label_wr_en: Out -- a label write.
  label_written:  Out(1) -- label word ``label_word`` has been written (both its labels).
  label_word:     Out -- the label word of the access (valid with label_written).
  label_rd_addr:  Out -- the label and prediction memories' read address (one cycle latency).
  label_rd_data, pred_rd_data: In(LABEL_BITS) -- their read data.

Timing (c: the first cycle of ``sel``): a weight write, a label write of the second label,
and every error are answered in c (the first label of a word is written in c, the second in
c + 1, answered then); a weight read reads in c, loads u_word in c + 1, shifts it down
``offset * 2 % P`` lanes in c + 2 onwards and is answered in the cycle after the last shift;
an activation write writes a byte a cycle from c (after any wait for ``limit_ready``) and is
answered with the fourth; a label or prediction read is answered in c + 3.
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ember import spec

from .arith import below
from .bus import answer_error, answer_ok


def data_words(build):
    """The resident data memory's 32-bit words (four input bytes each)."""
    return -(-build.data_bytes // 4)


class MemoryWindow(wiring.Component):
    """The bus slave of the engine's memory regions (module docstring)."""

    def __init__(self, build=spec.DEFAULT_BUILD):
        self.build = build
        super().__init__(self._members(build))

    @staticmethod
    def _members(build):
        P, W = build.lanes, spec.WEIGHT_BITS
        # the input batch's size fits the product of its factors' registers' widths
        limit_bits = (build.settings()["batch"].bits + build.descriptor_fields()["inputs"].bits)
        return {
            "sel": In(1),
            "addr": In(spec.BUS_ADDR_BITS),
            "write": In(1),
            "w_data": In(spec.BUS_DATA_BITS),
            "ack": Out(1),
            "err": Out(1),
            "data": Out(spec.BUS_DATA_BITS),
            "busy": In(1),
            "act_limit": In(limit_bits),
            "limit_ready": In(1),
            "classes": In(build.descriptor_fields()["outputs"].bits),
            "w_wr_addr": Out(ceil_log2(build.weight_words)),
            "w_wr_data": Out(P * W),
            "w_wr_en": Out(P),
            "w_rd": Out(1),
            "w_rd_addr": Out(ceil_log2(build.weight_words)),
            "u_word_load": Out(1),
            "u_word_shift": Out(1),
            "u_word_low": In(spec.BUS_DATA_BITS),
            "act_wr_addr": Out(ceil_log2(build.act_bytes)),
            "act_wr_data": Out(spec.ACT_BITS),
            "act_wr_en": Out(1),
            "label_wr_addr": Out(ceil_log2(build.max_batch)),
            "label_wr_data": Out(spec.LABEL_BITS),
            "label_wr_en": Out(1),
            "label_written": Out(1),
            "label_word": Out(range((build.max_batch + 1) // 2)),
            "label_rd_addr": Out(ceil_log2(build.max_batch)),
            "label_rd_data": In(spec.LABEL_BITS),
            "pred_rd_data": In(spec.LABEL_BITS),
        }

    def elaborate(self, platform):
        m = Module()
        r = _Access(self)
        with m.If(self.sel):
            with m.Switch(r.region):
                self._regions(m, r)
                with m.Default():
                    m.d.comb += r.err("out_of_range")
        return m

    def _regions(self, m, r):
        with m.Case(r.regions["weights"]):
            self._weights(m, r)
        with m.Case(r.regions["acts"]):
            self._acts(m, r)
        with m.Case(r.regions["labels"], r.regions["predictions"]):
            self._labels(m, r)

    def _weights(self, m, r):
        bld, P = self.build, self.build.lanes
        LOGP = P.bit_length() - 1
        offset = r.offset
        # two lanes per bus word; word = offset*2 // P
        word = offset[LOGP - 1:]
        pair = offset[:LOGP - 1] if LOGP > 1 else Const(0, 1)
        with m.If(~below(word, bld.weight_words)):
            m.d.comb += r.err("out_of_range")
        with m.Elif(self.busy):
            m.d.comb += r.err("busy")
        with m.Elif(r.wr):
            m.d.comb += [self.w_wr_addr.eq(word),
                         self.w_wr_data.eq(self.w_data.replicate(P // 2)),
                         self.w_wr_en.eq(Const(0b11, 2) << (pair * 2))]
            m.d.comb += r.ack()
        with m.Else():
            # read: address, then the word into the update unit's u_word, which shifts down
            # a lane per cycle until the pair is at its bottom (no P * 16-to-32 multiplexer;
            # the link is far slower than this)
            with m.Switch(r.bus_phase):
                with m.Case(0):
                    m.d.comb += [self.w_rd.eq(1), self.w_rd_addr.eq(word)]
                    m.d.sync += [r.bus_phase.eq(1), r.lanes_left.eq(pair << 1)]
                with m.Case(1):
                    m.d.comb += self.u_word_load.eq(1)
                    m.d.sync += r.bus_phase.eq(2)
                with m.Default():
                    with m.If(r.lanes_left != 0):
                        m.d.comb += self.u_word_shift.eq(1)
                        m.d.sync += r.lanes_left.eq(r.lanes_left - 1)
                    with m.Else():
                        m.d.comb += r.ack(self.u_word_low)
                        m.d.sync += r.bus_phase.eq(0)

    def _keep_byte(self, byte):
        """An input byte inside the batch (v1: below batch * inputs of layer 0)."""
        return below(byte, self.act_limit)

    def _acts(self, m, r):
        # four bytes per bus word, written one per cycle; bytes past the input batch are not
        # written (nor counted)
        bld, offset = self.build, r.offset
        byte = Cat(r.byte_step, offset)
        with m.If(~below(offset, (bld.act_bytes + 3) // 4)):
            m.d.comb += r.err("out_of_range")
        with m.Elif(self.busy):
            m.d.comb += r.err("busy")
        with m.Elif(r.wr & ~self.limit_ready):
            pass        # wait: the engine is recomputing the limit
        with m.Elif(r.wr):
            with m.If(self._keep_byte(byte)):
                m.d.comb += [self.act_wr_addr.eq(byte), self.act_wr_en.eq(1),
                             self.act_wr_data.eq(
                                 self.w_data.word_select(r.byte_step, spec.ACT_BITS))]
            m.d.sync += r.byte_step.eq(r.byte_step + 1)
            with m.If(r.byte_step == 3):
                m.d.comb += r.ack()
        with m.Else():
            m.d.comb += r.err("bad_value")      # activations are write-only

    def _labels(self, m, r):
        bld, offset, byte_step = self.build, r.offset, r.byte_step
        idx = Cat(Const(0, 1), offset)
        is_labels = r.region == r.regions["labels"]
        m.d.comb += self.label_word.eq(offset)
        mem_rd = Mux(is_labels, self.label_rd_data, self.pred_rd_data)
        with m.If(~below(offset, (bld.max_batch + 1) // 2)):
            m.d.comb += r.err("out_of_range")
        with m.Elif(self.busy):
            m.d.comb += r.err("busy")
        with m.Elif(r.wr & is_labels & ~byte_step[0] &
                    ~(below(self.w_data[:spec.LABEL_BITS], self.classes) &
                      below(self.w_data[spec.LABEL_BITS:], self.classes))):
            # both labels are checked against the class count before either is written: a
            # word with a label out of range changes nothing
            m.d.comb += r.err("bad_value")
        with m.Elif(r.wr & is_labels):
            m.d.comb += [self.label_wr_addr.eq(idx | byte_step[0]), self.label_wr_en.eq(1),
                         self.label_wr_data.eq(
                             self.w_data.word_select(byte_step[0], spec.LABEL_BITS))]
            m.d.sync += byte_step.eq(Mux(byte_step[0], 0, 1))
            with m.If(byte_step[0]):
                m.d.comb += r.ack() + [self.label_written.eq(1)]
        with m.Elif(r.wr):
            m.d.comb += r.err("bad_value")
        with m.Else():
            # two reads of a label or prediction, one cycle of latency each
            m.d.comb += self.label_rd_addr.eq(idx | r.bus_phase[1])
            with m.Switch(r.bus_phase):
                with m.Case(0):
                    m.d.sync += r.bus_phase.eq(1)
                with m.Case(1):
                    m.d.sync += [r.bus_rdata.eq(mem_rd), r.bus_phase.eq(2)]
                with m.Case(2):
                    m.d.sync += r.bus_phase.eq(3)
                with m.Case(3):
                    m.d.comb += r.ack(Cat(r.bus_rdata, mem_rd))
                    m.d.sync += r.bus_phase.eq(0)


class _Access:
    """The decoded access and the sub-step registers the regions share."""

    def __init__(self, win):
        self.region = win.addr[spec.REGION_BITS:]
        self.offset = win.addr[:spec.REGION_BITS]
        self.regions = {name: base >> spec.REGION_BITS
                        for name, (base, _) in spec.ADDRESS_MAP.items() if base >> spec.REGION_BITS}
        self.wr = win.write
        self.bus_phase = Signal(2)          # sub-steps of multi-cycle accesses
        self.bus_rdata = Signal(spec.LABEL_BITS)    # a read's first half (label, prediction)
        self.lanes_left = Signal(range(win.build.lanes))    # u_word's shifts left (weights)
        self.byte_step = Signal(2)          # the byte (acts) or label (bit 0) being written
        self._win = win

    def ack(self, data=None):
        return answer_ok(self._win, data)

    def err(self, name):
        return answer_error(self._win, name)


class SampleWindow(MemoryWindow):
    """Engine v2's memory window (ember_hw.sample_engine: ``Build.dataflow`` "samples").

    Golden twin: the v2 half of ``ember.virtual.VirtualEngine``'s ``read``/``write`` (its
    ``self.v2`` branches) and the v2 layouts of ``spec.ADDRESS_MAP`` (ember.regmap). What
    differs from `MemoryWindow`:

    - weights: one weight per memory word (``weight_words * P`` of them), two per bus word,
      weight ``2 * offset`` in the low half. A write writes the low weight in c and the high
      one in c + 1 (answered then); a read reads both and is answered in c + 2.
      ``out_of_range`` from ``offset * 2 >= weight_words * P``.
    - acts: the input batch in sample blocks (byte ``(s * K + k) * P + p`` holds input k of
      sample s * P + p): a byte is written if its sample is in the batch: its word
      (byte // P) is below ``full_words`` (the words of the full sample blocks:
      (batch // P) * K), or below ``block_words`` (every block's: blocks * K) with its lane
      below ``tail`` (batch % P); and its word inside the core's activation memory.
    - program: the program memory's words (``Build.program_words``), written in c, read
      in c + 1.
    - schedule, data, data_labels (a build with the ``resident`` unit; docs/protocol.md
      section 11): write only (a read: ``bad_value``), ``out_of_range`` past
      ``Build.data_samples`` schedule words, ``ceil(Build.data_bytes / 4)`` data words and
      ``ceil(Build.data_samples / 2)`` label words. A schedule or data word is written in c;
      a data word is ``busy`` while a command runs, a schedule word while ``sched_busy`` has
      the bit of its half (offset >= ``spec.schedule_half_words``: half 1);
      a label word's two labels are checked against ``classes`` (either at or above it:
      ``bad_value``, neither written) and written in c and c + 1 (a second label past
      data_samples is dropped).

    Ports: MemoryWindow's, with these in place of its weight and activation limit ports:
      w_wr_addr, w_wr_data, w_wr_en: Out -- a weight write (one weight);
      w_rd_addr: Out; w_rd_data: In -- a weight, the cycle after its address;
      full_words, block_words, tail: In -- the input batch's extent (above), valid while
                limit_ready;
      prog_wr_addr, prog_wr_data, prog_wr_en: Out -- a program word write;
      prog_rd_addr: Out; prog_rd_data: In -- a program word, the cycle after its address.
      (resident builds) sched_wr_*, data_wr_*, dlabel_wr_*: Out -- a schedule word, a data
                word (four input bytes) or a data label write.
      (resident builds) sched_busy: In(2) -- bit h: half h of the schedule is in use (an
                EPOCH or EVALUATE that reads it runs).
    """

    def __init__(self, build):
        P = build.lanes
        depth = build.weight_words * P
        self.weight_depth, self.act_words = depth, build.act_bytes // P
        self.program_words = build.program_words
        super().__init__(build)

    def _members(self, build):
        P, depth = build.lanes, self.weight_depth
        members = MemoryWindow._members(build)
        for name in ("act_limit", "w_wr_addr", "w_wr_data", "w_wr_en", "w_rd", "w_rd_addr",
                     "u_word_load", "u_word_shift", "u_word_low"):
            del members[name]
        words_bits = build.settings()["batch"].bits + build.descriptor_fields()["inputs"].bits
        members.update({
            "w_wr_addr": Out(ceil_log2(depth)), "w_wr_data": Out(spec.WEIGHT_BITS),
            "w_wr_en": Out(1), "w_rd_addr": Out(ceil_log2(depth)),
            "w_rd_data": In(spec.WEIGHT_BITS),
            "full_words": In(words_bits), "block_words": In(words_bits),
            "tail": In(range(P)),
            "prog_wr_addr": Out(ceil_log2(self.program_words)),
            "prog_wr_data": Out(spec.BUS_DATA_BITS), "prog_wr_en": Out(1),
            "prog_rd_addr": Out(ceil_log2(self.program_words)),
            "prog_rd_data": In(spec.BUS_DATA_BITS),
        })
        if "resident" in build.features:
            samples = ceil_log2(build.data_samples)
            members.update({
                "sched_wr_addr": Out(samples), "sched_wr_data": Out(spec.BUS_DATA_BITS),
                "sched_wr_en": Out(1), "sched_busy": In(2),
                "data_wr_addr": Out(ceil_log2(data_words(build))),
                "data_wr_data": Out(spec.BUS_DATA_BITS), "data_wr_en": Out(1),
                "dlabel_wr_addr": Out(samples), "dlabel_wr_data": Out(spec.LABEL_BITS),
                "dlabel_wr_en": Out(1),
            })
        return members

    def _regions(self, m, r):
        super()._regions(m, r)
        with m.Case(r.regions["program"]):
            self._program(m, r)
        if "resident" in self.build.features:
            with m.Case(r.regions["schedule"]):
                half = ~below(r.offset, spec.schedule_half_words(self.build))
                self._resident_words(m, r, self.build.data_samples, "sched",
                                     self.sched_busy.bit_select(half, 1))
            with m.Case(r.regions["data"]):
                self._resident_words(m, r, data_words(self.build), "data", self.busy)
            with m.Case(r.regions["data_labels"]):
                self._data_labels(m, r)

    def _resident_words(self, m, r, words, memory, busy):
        """A schedule or data word: write only, one write; `busy` answers it busy."""
        with m.If(~below(r.offset, words)):
            m.d.comb += r.err("out_of_range")
        with m.Elif(busy):
            m.d.comb += r.err("busy")
        with m.Elif(r.wr):
            m.d.comb += [getattr(self, f"{memory}_wr_addr").eq(r.offset),
                         getattr(self, f"{memory}_wr_data").eq(self.w_data),
                         getattr(self, f"{memory}_wr_en").eq(1), r.ack()]
        with m.Else():
            m.d.comb += r.err("bad_value")

    def _data_labels(self, m, r):
        """Two labels a word, both checked against the class count before either is
        written (as the labels region)."""
        samples, step = self.build.data_samples, r.byte_step
        index = Cat(step[0], r.offset)
        with m.If(~below(r.offset, (samples + 1) // 2)):
            m.d.comb += r.err("out_of_range")
        with m.Elif(self.busy):
            m.d.comb += r.err("busy")
        with m.Elif(~r.wr):
            m.d.comb += r.err("bad_value")
        with m.Elif(~step[0] & ~(below(self.w_data[:spec.LABEL_BITS], self.classes) &
                                 below(self.w_data[spec.LABEL_BITS:], self.classes))):
            m.d.comb += r.err("bad_value")
        with m.Else():
            m.d.comb += [self.dlabel_wr_addr.eq(index),
                         self.dlabel_wr_en.eq(below(index, samples)),
                         self.dlabel_wr_data.eq(
                             self.w_data.word_select(step[0], spec.LABEL_BITS))]
            m.d.sync += step.eq(Mux(step[0], 0, 1))
            with m.If(step[0]):
                m.d.comb += r.ack()

    def _weights(self, m, r):
        low = Cat(Const(0, 1), r.offset)        # the low weight's index
        with m.If(~below(r.offset, self.weight_depth // 2)):
            m.d.comb += r.err("out_of_range")
        with m.Elif(self.busy):
            m.d.comb += r.err("busy")
        with m.Elif(r.wr):
            half = r.bus_phase[0]
            m.d.comb += [self.w_wr_addr.eq(low | half), self.w_wr_en.eq(1),
                         self.w_wr_data.eq(self.w_data.word_select(half, spec.WEIGHT_BITS))]
            m.d.sync += r.bus_phase.eq(~half)
            with m.If(half):
                m.d.comb += r.ack()
        with m.Else():
            with m.Switch(r.bus_phase):
                with m.Case(0):
                    m.d.comb += self.w_rd_addr.eq(low)
                    m.d.sync += r.bus_phase.eq(1)
                with m.Case(1):
                    m.d.comb += self.w_rd_addr.eq(low | 1)
                    m.d.sync += [r.bus_rdata.eq(self.w_rd_data), r.bus_phase.eq(2)]
                with m.Default():
                    m.d.comb += r.ack(Cat(r.bus_rdata, self.w_rd_data))
                    m.d.sync += r.bus_phase.eq(0)

    def _keep_byte(self, byte):
        LOGP = self.build.lanes.bit_length() - 1
        word, lane = byte[LOGP:], byte[:LOGP]
        return below(word, self.act_words) & (below(word, self.full_words) |
                                              (below(word, self.block_words)
                                               & below(lane, self.tail)))

    def _program(self, m, r):
        with m.If(~below(r.offset, self.program_words)):
            m.d.comb += r.err("out_of_range")
        with m.Elif(self.busy):
            m.d.comb += r.err("busy")
        with m.Elif(r.wr):
            m.d.comb += [self.prog_wr_addr.eq(r.offset), self.prog_wr_data.eq(self.w_data),
                         self.prog_wr_en.eq(1), r.ack()]
        with m.Else():
            m.d.comb += self.prog_rd_addr.eq(r.offset)
            with m.If(r.bus_phase == 0):
                m.d.sync += r.bus_phase.eq(1)
            with m.Else():
                m.d.comb += r.ack(self.prog_rd_data)
                m.d.sync += r.bus_phase.eq(0)
