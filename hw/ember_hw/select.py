"""ssProp channel selection (docs/numerics.md section 9): the random variant's LFSR and the
top-k selector. Golden twins: ``ember.golden.lfsr_sequence`` and ``ember.golden.select_channels``.

``Lfsr16`` produces the random variant's channel scores; ``ChannelSelector`` keeps the k channels
with the largest scores of one layer, equal scores keeping the lower index. Both live in the
``sync`` domain.
"""

from amaranth.hdl import Const, Module, Mux, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ember.spec import GRAD_BITS, LFSR_TAPS, MAX_BATCH, MAX_WIDTH

#: Width of the random variant's LFSR, implied by its tap mask.
LFSR_BITS = LFSR_TAPS.bit_length()

#: Width of the largest top-k score, sum over the batch of |dY| (magnitudes up to 2**15 - 1).
TOP_K_SCORE_BITS = (MAX_BATCH * ((1 << (GRAD_BITS - 1)) - 1)).bit_length()


class Lfsr16(wiring.Component):
    """The random variant's 16-bit Galois LFSR (taps ``spec.LFSR_TAPS``).

    One step: ``lsb = s & 1; s >>= 1; if lsb: s ^= LFSR_TAPS``. After ``load`` of a seed and n
    steps, ``state`` is element n (1-based) of ``golden.lfsr_sequence(seed, n)[0]``.

    Ports (all sampled at the clock edge; ``state`` is the register itself):

    - ``seed`` In(16), ``load`` In(1): ``state <= seed``. Takes priority over ``step``.
    - ``step`` In(1): advance one state per cycle it is high.
    - ``state`` Out(16): the current state. A seed of 0 stays 0 (the host keeps seeds in
      1..65535).
    """

    seed: In(LFSR_BITS)
    load: In(1)
    step: In(1)
    state: Out(LFSR_BITS)

    def elaborate(self, platform):
        m = Module()
        shifted = self.state >> 1
        with m.If(self.load):
            m.d.sync += self.state.eq(self.seed)
        with m.Elif(self.step):
            m.d.sync += self.state.eq(Mux(self.state[0], shifted ^ LFSR_TAPS, shifted))
        return m


class ChannelSelector(wiring.Component):
    """Top-k channel selector of one layer: keeps the ``keep`` largest of the first ``channels``
    scores; among equal scores the lower index wins (bit-exact with
    ``golden.select_channels(scores[:channels], keep)``).

    Parameters:

    - ``max_channels``: depth of the score and mask memories (1..spec.MAX_WIDTH).
    - ``score_bits``: score width. The default 32 holds both variants' scores: the top-k
      sum over the batch of |dY| (``TOP_K_SCORE_BITS`` bits) and 16-bit LFSR states.

    Ports (I = ceil_log2(max_channels), C = bit_length(max_channels)):

    - ``score_index`` In(I), ``score_data`` In(score_bits), ``score_we`` In(1): write one score
      into the score memory at the clock edge. Do not write while ``busy``; a write in the same
      cycle as ``start`` is seen by the selection.
    - ``channels`` In(C): N, the number of scores (at most ``max_channels``).
    - ``keep`` In(C): k, the number to keep. k >= N keeps all N; k = 0 keeps none.
      ``channels`` and ``keep`` are sampled in the ``start`` cycle.
    - ``start`` In(1): one-cycle pulse, ignored while ``busy``.
    - ``busy`` Out(1): high from the cycle after ``start`` up to, not including, ``done``.
    - ``done`` Out(1): one-cycle pulse; the mask and ``kept_count`` are valid from this cycle
      until the next ``start``.
    - ``kept_count`` Out(C): channels kept, min(k, N).
    - ``kept_index`` In(I), ``kept`` Out(1): mask read port, a synchronous memory read:
      ``kept`` holds the mask bit of the ``kept_index`` presented in the previous cycle.
      Indices >= N read 0.

    Algorithm. The threshold T is the k-th largest score. A bitwise binary search finds it
    MSB first: for candidate = T | bit, one pass over the N scores counts those >= candidate,
    and the bit is kept if that count >= k. The number of scores > T equals the count of the
    last rejected candidate (that candidate is exactly T + 1; 0 if none was rejected), so
    ``tie_quota`` = k - count(> T) is known without an extra pass. A final fill pass, in index
    order, keeps every score > T, and a score == T while fewer than ``tie_quota`` ties were
    kept. Two shortcuts leave the result unchanged:

    - the first pass also ORs all scores; bits above the OR's highest one would count no
      score and be rejected, so the search jumps past them (and ends if all scores are 0);
    - when an accepted candidate is met by exactly k scores, those are the kept set: the
      search stops with T = candidate. ``tie_quota`` (k minus the count of the last rejected
      candidate, which is above T) is then at least the number of ties, so all are kept.

    k >= N (and k = 0, N = 0) skip the search.

    Timing. A pass reads one score per cycle and takes N + 1 cycles (a one-cycle memory read
    latency). With P search passes, ``done`` rises (P + 1) * (N + 1) + 1 cycles after the
    ``start`` cycle, where 1 <= P <= min(score_bits, 1 + bit_length(max score)); the worst
    case is (score_bits + 1) * (N + 1) + 1. With k >= N: N + 2 cycles; with N = 0: 1 cycle.
    """

    def __init__(self, max_channels=1024, score_bits=32):
        if not 1 <= max_channels <= MAX_WIDTH:
            raise ValueError(f"max_channels {max_channels} is outside 1..{MAX_WIDTH} "
                             f"(spec.MAX_WIDTH)")
        if score_bits < 1:
            raise ValueError(f"score_bits {score_bits} must be at least 1")
        self.max_channels = max_channels
        self.score_bits = score_bits
        index_bits = max(1, ceil_log2(max_channels))
        count_bits = max_channels.bit_length()
        super().__init__({
            "score_index": In(index_bits),
            "score_data": In(score_bits),
            "score_we": In(1),
            "channels": In(count_bits),
            "keep": In(count_bits),
            "start": In(1),
            "busy": Out(1),
            "done": Out(1),
            "kept_count": Out(count_bits),
            "kept_index": In(index_bits),
            "kept": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        score_bits = self.score_bits
        index_bits = len(self.score_index)
        count_bits = len(self.channels)

        m.submodules.scores = scores = Memory(
            shape=unsigned(score_bits), depth=self.max_channels, init=[])
        m.submodules.mask = mask = Memory(shape=1, depth=self.max_channels, init=[])
        score_wr = scores.write_port()
        score_rd = scores.read_port()
        mask_wr = mask.write_port()
        mask_rd = mask.read_port()

        m.d.comb += [
            score_wr.addr.eq(self.score_index),
            score_wr.data.eq(self.score_data),
            score_wr.en.eq(self.score_we),
        ]

        # Selection parameters, latched at start.
        n_channels = Signal(count_bits)
        keep_k = Signal(count_bits)

        # Mask read port: out-of-range indices read 0 rather than a stale earlier mask.
        kept_in_range = Signal()
        m.d.sync += kept_in_range.eq(self.kept_index < n_channels)
        m.d.comb += [
            mask_rd.addr.eq(self.kept_index),
            self.kept.eq(mask_rd.data & kept_in_range),
        ]

        # The pass engine: issue addresses 0..N-1, one per cycle; the score of data_index is on
        # score_rd.data in the following cycle, flagged by data_valid (data_last for N-1).
        issue_index = Signal(index_bits)
        issuing = Signal()
        data_index = Signal(index_bits)
        data_valid = Signal()
        data_last = Signal()
        issue_last = issue_index == n_channels - 1
        m.d.comb += score_rd.addr.eq(issue_index)
        m.d.sync += [
            data_valid.eq(issuing),
            data_last.eq(issuing & issue_last),
            data_index.eq(issue_index),
        ]
        with m.If(issuing):
            m.d.sync += issue_index.eq(issue_index + 1)
            with m.If(issue_last):
                m.d.sync += issuing.eq(0)

        def start_pass():
            m.d.sync += [issue_index.eq(0), issuing.eq(1)]

        score = score_rd.data

        # Threshold search state.
        threshold = Signal(score_bits)
        bit_pos = Signal(range(score_bits))
        candidate = threshold | (Const(1, score_bits) << bit_pos)
        ge_count = Signal(count_bits)
        ge_count_next = ge_count + (score >= candidate)
        tie_quota = Signal(count_bits)
        score_or = Signal(score_bits)
        score_or_next = score_or | score
        top_bit = Signal(range(score_bits))
        for b in range(score_bits):
            with m.If(score_or_next[b]):
                m.d.comb += top_bit.eq(b)
        next_bit = Mux(top_bit < bit_pos - 1, top_bit, bit_pos - 1)

        # Fill state.
        ties_kept = Signal(count_bits)
        kept_total = Signal(count_bits)
        above = score > threshold
        tie = score == threshold
        keep_this = above | (tie & (ties_kept < tie_quota))
        m.d.comb += self.kept_count.eq(kept_total)

        m.d.sync += self.done.eq(0)

        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [
                        n_channels.eq(self.channels),
                        keep_k.eq(self.keep),
                        ge_count.eq(0),
                        score_or.eq(0),
                        ties_kept.eq(0),
                        kept_total.eq(0),
                    ]
                    with m.If(self.channels == 0):
                        m.d.sync += self.done.eq(1)
                    with m.Elif(self.keep == 0):
                        # No score exceeds all ones and no tie may be kept.
                        m.d.sync += [threshold.eq(-1), tie_quota.eq(0)]
                        start_pass()
                        m.next = "FILL"
                    with m.Elif(self.keep >= self.channels):
                        # Every score is > 0 or a tie with 0, and the quota covers all ties.
                        m.d.sync += [threshold.eq(0), tie_quota.eq(self.keep)]
                        start_pass()
                        m.next = "FILL"
                    with m.Else():
                        m.d.sync += [
                            threshold.eq(0),
                            bit_pos.eq(score_bits - 1),
                            tie_quota.eq(self.keep),
                        ]
                        start_pass()
                        m.next = "SEARCH"

            with m.State("SEARCH"):
                with m.If(data_valid):
                    m.d.sync += [ge_count.eq(ge_count_next), score_or.eq(score_or_next)]
                    with m.If(data_last):
                        accept = ge_count_next >= keep_k
                        exact = ge_count_next == keep_k
                        m.d.sync += ge_count.eq(0)
                        with m.If(accept):
                            m.d.sync += threshold.eq(candidate)
                        with m.Else():
                            m.d.sync += tie_quota.eq(keep_k - ge_count_next)
                        start_pass()
                        with m.If(exact | (bit_pos == 0) | (score_or_next == 0)):
                            m.next = "FILL"
                        with m.Else():
                            m.d.sync += bit_pos.eq(next_bit)

            with m.State("FILL"):
                m.d.comb += [
                    mask_wr.addr.eq(data_index),
                    mask_wr.data.eq(keep_this),
                    mask_wr.en.eq(data_valid),
                ]
                with m.If(data_valid):
                    m.d.sync += [
                        kept_total.eq(kept_total + keep_this),
                        ties_kept.eq(ties_kept + (tie & keep_this)),
                    ]
                    with m.If(data_last):
                        m.d.sync += self.done.eq(1)
                        m.next = "IDLE"

        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))

        return m
