"""The one definition of every format, width, limit and counter in Ember.

Gateware (``hw/``), the golden model, the host and the documentation generator all import
these names; nothing here is typed twice anywhere else. docs/numerics.md explains each one.
"""

from dataclasses import dataclass, field, replace

# --- Number formats -------------------------------------------------------------------------
#: Master weights: signed 16-bit, Q1.14 (value = w / 2**WEIGHT_FRAC_BITS, range [-2, 2)).
WEIGHT_BITS = 16
WEIGHT_FRAC_BITS = 14
#: Activations (inputs of every layer, including the network input): unsigned 8-bit, UQ2.6.
ACT_BITS = 8
ACT_FRAC_BITS = 6
ACT_MAX = (1 << ACT_BITS) - 1
#: Logits of the output layer: signed 16-bit, Q7.8.
LOGIT_BITS = 16
LOGIT_FRAC_BITS = 8
#: Gradients dY: signed 16-bit with a per-tensor power-of-two scale (see docs/numerics.md).
GRAD_BITS = 16
#: The output gradient (softmax minus one-hot) is Q0.15.
OUT_GRAD_FRAC_BITS = 15
#: Raw input gradients dX are saturated to this width before the per-tensor scale is chosen.
DX_BITS = 32
#: The golden model's accumulator width: 48 bits hold any sum of the three GEMM phases for
#: layers up to MAX_WIDTH. The gateware sizes each accumulator from its build instead
#: (Build.lane_acc_bits, dx_acc_bits, pred_bits); the energy model charges 48-bit adds.
ACC_BITS = 48
#: Widest layer (inputs or outputs) any build accepts; ACC_BITS is sized from it.
MAX_WIDTH = 4096
MAX_LAYERS = 8
MAX_BATCH = 256

#: Default per-layer forward shifts: hidden layers keep UQ2.6 (Q1.14 x UQ2.6 -> >> 14),
#: the output layer produces Q7.8 logits (>> 12).
HIDDEN_SHIFT = WEIGHT_FRAC_BITS + ACT_FRAC_BITS - ACT_FRAC_BITS
OUTPUT_SHIFT = WEIGHT_FRAC_BITS + ACT_FRAC_BITS - LOGIT_FRAC_BITS

# --- Predictive sign gradient -------------------------------------------------------------------
#: The predictor multiplies the top PSG_ACT_MSBS bits of the activation by the top
#: PSG_GRAD_MSBS bits of the gradient (both are bit slices of stored values).
PSG_ACT_MSBS = 4
PSG_GRAD_MSBS = 8

# --- Softmax cross-entropy gradient unit ------------------------------------------------------
#: log2(e) as LOG2E_NUM / 2**LOG2E_SHIFT (1477/1024 = 1.44238, error 1e-4).
LOG2E_NUM = 1477
LOG2E_SHIFT = 10
#: Fraction bits of the base-2 exponent that index the table.
EXP2_FRAC_BITS = 4
#: EXP2_TABLE[i] = round(2**15 * 2**(-i/16)).
EXP2_TABLE = tuple(int(round((1 << 15) * 2.0 ** (-i / (1 << EXP2_FRAC_BITS))))
                   for i in range(1 << EXP2_FRAC_BITS))
#: The reciprocal of the exponent sum is floor(2**RECIP_BITS / S).
RECIP_BITS = 31

# --- ssProp -----------------------------------------------------------------------------------
#: Keep ratio as an 8-bit fraction: keep = keep_q8 / 256; 256 means dense (no selection).
KEEP_ONE = 256
#: 16-bit Galois LFSR for the random variant (x^16 + x^14 + x^13 + x^11 + 1).
LFSR_TAPS = 0xB400

# --- Update ------------------------------------------------------------------------------------
#: The SGD update shift is clamped to this range after the gradient-scale correction.
UPDATE_SHIFT_MAX = 47

# --- Shifts ------------------------------------------------------------------------------------
#: Largest forward requantization shift a layer descriptor takes (its "shift" field).
FORWARD_SHIFT_MAX = 31
#: Largest power-of-two scale of a layer's input gradient: dX (DX_BITS, signed) is shifted
#: until its largest magnitude fits the GRAD_BITS - 1 magnitude bits of dY.
DX_SHIFT_MAX = DX_BITS - (GRAD_BITS - 1)
#: The engine's one rounding shifter serves all three.
SHIFT_MAX = max(UPDATE_SHIFT_MAX, FORWARD_SHIFT_MAX, DX_SHIFT_MAX)

# --- Event counters -------------------------------------------------------------------------------
#: Every event the engine counts, in register-map order. Names are the JSON keys too.
COUNTERS = (
    # work done
    "batches",               # training batches run on the device
    "samples",               # training samples run on the device
    "infer_samples",         # inference samples
    "mac_forward",           # full-precision MACs of the forward pass (training and inference)
    "mac_input_grad",        # full-precision MACs of the input-gradient pass
    "mac_weight_grad",       # full-precision MACs of the weight-gradient pass
    "mac_weight_grad_low",   # low-precision (PSG predictor) MACs
    "loss_elements",         # output neurons through the softmax-gradient unit
    # work skipped, in MACs a dense step would have done, by reason
    "skip_slu",
    "skip_ssprop",
    "skip_psg",
    "skip_zero",
    # memory traffic (see docs/numerics.md "Event accounting" for the unit of each)
    "weight_reads",          # 16-bit weights (the weight memory is banked per lane)
    "weight_writes",         # only weights that change are written
    "act_reads",             # 8-bit activations
    "act_writes",
    "grad_reads",            # single gradient entries (logits, dY, dX scratch; 32-bit)
    "grad_writes",
    "grad_lane_reads",       # 16-bit dY entries read by the lanes in the GEMM phases
    "act_msb_reads",         # PSG predictor: the top PSG_ACT_MSBS bits of an activation
    "grad_msb_lane_reads",   # PSG predictor: the top PSG_GRAD_MSBS bits of a dY entry
    "data_reads",            # resident data unit: 32-bit data-memory words the gather reads
    # link
    "link_rx_bytes",
    "link_tx_bytes",
    # cycles (simulated and real boards only; the model leaves them at zero)
    "cycles",
    "cycles_forward",
    "cycles_loss",
    "cycles_select",
    "cycles_input_grad",
    "cycles_weight_grad",
    "cycles_update",
)
#: The unit (FEATURES) whose work a counter counts, for the counters that count nothing on a
#: build without it: engine v2's counter file keeps no logic for them there (each reads 0).
COUNTER_UNITS = {"mac_weight_grad_low": "psg", "skip_psg": "psg", "act_msb_reads": "psg",
                 "grad_msb_lane_reads": "psg", "skip_ssprop": "ssprop",
                 "data_reads": "resident"}
CYCLE_COUNTERS = tuple(c for c in COUNTERS if c.startswith("cycles"))
#: Counters every backend must agree on exactly.
EXACT_COUNTERS = tuple(c for c in COUNTERS if c not in CYCLE_COUNTERS)
#: Skipped-work reasons; "smd" is counted by the host (a dropped batch never reaches the device).
SKIP_REASONS = ("smd", "slu", "ssprop", "psg", "zero")
COUNTER_BITS = 48

# --- iCE40 UltraPlus single-port RAM (the weight memory's SPRAM path, Build.weight_spram) ---------
#: One SB_SPRAM256KA is 16384 words of 16 bits: one weight lane. The iCE40UP5K has four.
SPRAM_WORDS = 16384
SPRAM_BLOCKS = 4


#: Engine v2's drains (the dX drain, the forward writeback) empty the lanes' snapshot in this
#: many cycles (Build.drain_lanes).
DX_DRAIN_CYCLES = 8


#: An epoch's sample order (ember.schedule.epoch_order, the resident data unit's order
#: generator): a 4-round Feistel permutation keyed by ORDER_KEY_BITS, round i's key the byte
#: 8i.. of the key, so each half has at most 8 bits and an order at most 2**16 samples.
ORDER_KEY_BITS = 32
ORDER_ROUNDS = 4
ORDER_ROUND_KEY_BITS = ORDER_KEY_BITS // ORDER_ROUNDS
ORDER_MAX_SAMPLES = 1 << (2 * ORDER_ROUND_KEY_BITS)
#: An epoch's schedule word per mini-batch (ember.schedule.EpochSchedule.words): the LFSR
#: seed in the low SCHEDULE_SEED_BITS, the update mask above it (bit l: layer l updates) and
#: the SMD drop bit on top.
SCHEDULE_SEED_BITS = 16
SCHEDULE_MASK_LSB = SCHEDULE_SEED_BITS
SCHEDULE_DROP_BIT = 31
assert SCHEDULE_MASK_LSB + MAX_LAYERS <= SCHEDULE_DROP_BIT


def schedule_half_words(build):
    """H, the words of the schedule region's lower half: the largest power of two at most
    half of Build.data_samples (1 on a build of one sample). An EPOCH with `schedule_half` h
    reads its schedule words from h * H on, wrapping at data_samples: batch b's word is
    (h * H + b) mod data_samples. While an EPOCH or EVALUATE runs, a schedule word in the half
    it may read answers a write `busy` (schedule_halves_in_use), and a word in the other half
    takes it: the host writes the next epoch's schedule there meanwhile (docs/protocol.md
    section 11)."""
    return 1 << max(0, (build.data_samples // 2).bit_length() - 1)


def schedule_halves_in_use(build, batch, train_samples, half):
    """The halves (a set of 0 and 1) of the schedule region that an EPOCH of `train_samples`
    samples in batches of `batch`, reading from half `half`, may read: its own, or both when
    its batches outnumber a half's words (train_samples > batch * H). Offset o lies in half
    1 when o >= H. The engine's test needs no division: H is a power of two."""
    H = schedule_half_words(build)
    return {0, 1} if train_samples > batch * H else {half}


#: Optional engine units, in the bit order of the read-only FEATURES register. A build leaves
#: out the units it does not list in Build.features (to fit a small FPGA); the host refuses
#: settings that need a missing unit before it writes anything.
#: command_check is the engine's own check of every command against the build's memories
#: (ember_hw.stepcheck.StepCheck, COMMAND_CHECKS); a build without it checks only "layers"
#: and "batch" (no command can hang), and trusts its host for the rest. abort: the link
#: stays open while a command runs (STATUS, counters) and CONTROL_ABORT stops it (docs/
#: protocol.md section 10); a build without it answers a command's write when the command has
#: finished and takes no frame meanwhile. watchdog (needs abort): the sequencer's cycle limit
#: per command (the `watchdog` setting); a build without it has no such register.
#: resident: a data memory that holds a training and a test split, and the EPOCH and
#: EVALUATE commands that walk them on the device (docs/protocol.md section 11; engine v2
#: only, and Build.data_bytes > 0).
FEATURES = ("zero_skip", "slu", "psg", "ssprop", "ssprop_random", "command_check", "abort",
            "watchdog", "resident")
#: The units a build has unless it says otherwise: every one but resident data, whose
#: gateware is not written yet (issue 16); the model backend runs it on a build that lists it.
DEFAULT_FEATURES = tuple(f for f in FEATURES if f != "resident")


@dataclass(frozen=True)
class Setting:
    """One read-write register or layer-descriptor field of a build: its legal range and the
    register that holds it.

    lo, hi:   the values a write may carry. The host checks them before it writes; the engine
              (and the model) answer a write outside lo..hi `bad_value` and keep the value
              they had, so a register never holds a value it was not meant to.
    init:     the value after reset (may lie outside lo..hi: batch and layers start at 0,
              "nothing configured").
    feature:  the optional unit (FEATURES) whose setting this is; a build without that unit
              has no register for it: it reads as `init` and a write is answered and dropped.
    """
    name: str
    lo: int
    hi: int
    init: int = 0
    feature: str | None = None

    @property
    def bits(self):
        """The register's width: the fewest bits that hold 0..hi."""
        return max(1, self.hi.bit_length())

    def contains(self, value):
        """True if `value` is a legal setting."""
        return self.lo <= value <= self.hi


#: The engines' dataflows (Build.dataflow).
DATAFLOWS = ("outputs", "samples")
#: Engine v2's weight gradient holds a sample block's dY word of channel j in registers for
#: this many consecutive inputs k (one accumulator each, after the lanes' adder tree), so each
#: lane reads its dY entry once per group of inputs instead of once per MAC.
GRAD_HOLD = 4
#: The UART rate of a generic serial port, and of a build that names no other (Build.baud).
#: The boards' builds run faster (BUILDS["icebreaker"].baud, BUILDS["ulx3s"].baud).
DEFAULT_BAUD = 115200


@dataclass(frozen=True)
class Build:
    """What one engine build holds: the limits every configuration is checked against.

    lanes:           P, the MAC lanes (a power of two); one weight word holds P weights.
    weight_words:    depth of the weight memory in P-lane words.
    act_bytes:       activation memory: the inputs of every layer for a whole batch.
    grad_words:      depth of the P-lane gradient memory; two halves hold dY of a layer and
                     dY of the layer below (logits, in place, for the output layer).
    scratch_entries: 32-bit raw input-gradient (dX) entries for a whole batch.
    max_batch:       largest batch one train command accepts.
    clock_hz:        engine clock, for cycle-to-time conversion.
    features:        the optional units this build has (a subset of FEATURES).
    dataflow:        "outputs": v1's lanes over P outputs of one sample, the activation
                     broadcast (ember_hw.engine); "samples": engine v2's lanes over P samples,
                     the weight broadcast (ember.dataflow, ember_hw.sample_engine). The event
                     counts of the two differ in the reads (docs/numerics.md).
    baud:            the UART rate of the build's board top, bits per second (8N1): its
                     bitstream's UART runs at it (ember_boards.common.engine_on_uart divides
                     clock_hz by it), the BAUD register reads it, the host opens the board's
                     port at it and the energy model charges each link byte its time on the
                     line at it. A board build's must be a rate its USB-serial bridge makes
                     (docs/boards.md, "The link").
    weight_spram:    keep the weight memory in iCE40 UltraPlus SPRAM instead of a generic
                     memory (block RAM): on engine v1 one SB_SPRAM256KA per lane (so lanes <=
                     SPRAM_BLOCKS and weight_words <= SPRAM_WORDS), on engine v2 (dataflow
                     "samples", one weight read a cycle for all lanes) one SB_SPRAM256KA for
                     every weight (weight_words * lanes <= SPRAM_WORDS). Only the iCE40UP
                     bitstream and RTL simulation with Yosys's cell models (ember_sim adds
                     them) can take such a build, not the Amaranth simulator nor the ECP5
                     (SampleEngine's tests run its single-port schedule on a generic memory
                     there). See ember_hw.weights.
    data_bytes:      the resident data memory (feature "resident"): input bytes of the
                     training and the test split, one sample after another (0: none).
    data_samples:    the resident samples the data memory has labels for (train + test).
    program_words:   engine v2's program memory, 32-bit words (ember.dataflow.encode): the
                     longest program the build runs (check_network refuses a network whose
                     program needs more, dataflow.program_words_needed). 1024 is 8 block RAMs
                     of the iCE40, 512 four.
    """
    name: str = "sim"
    lanes: int = 8
    weight_words: int = 4096
    act_bytes: int = 16384
    grad_words: int = 4096
    scratch_entries: int = 8192
    max_batch: int = 64
    max_layers: int = MAX_LAYERS
    max_width: int = 1024
    clock_hz: int = 48_000_000
    baud: int = DEFAULT_BAUD
    weight_spram: bool = False
    program_words: int = 1024
    features: tuple = DEFAULT_FEATURES
    dataflow: str = "outputs"
    data_bytes: int = 0
    data_samples: int = 0

    def __post_init__(self):
        unknown = set(self.features) - set(FEATURES)
        if unknown:
            raise ConfigError(f"build '{self.name}': unknown features {sorted(unknown)}; "
                              f"known: {', '.join(FEATURES)}")
        if self.dataflow not in DATAFLOWS:
            raise ConfigError(f"build '{self.name}': dataflow {self.dataflow!r}; known: "
                              f"{', '.join(DATAFLOWS)}")
        if "ssprop_random" in self.features and "ssprop" not in self.features:
            raise ConfigError(f"build '{self.name}': ssprop_random needs ssprop")
        if "watchdog" in self.features and "abort" not in self.features:
            raise ConfigError(f"build '{self.name}': watchdog needs abort (its stop answers "
                              "the command's deferred write)")
        if "resident" in self.features and (self.dataflow != "samples" or self.data_bytes < 1
                                            or not 1 <= self.data_samples <= ORDER_MAX_SAMPLES):
            raise ConfigError(f"build '{self.name}': resident data needs engine v2 (dataflow "
                              f"'samples'), data_bytes >= 1 and 1..{ORDER_MAX_SAMPLES} "
                              f"data_samples; it has {self.dataflow!r}, {self.data_bytes}, "
                              f"{self.data_samples}")
        if self.program_words < 1:
            raise ConfigError(f"build '{self.name}': program_words {self.program_words} must "
                              "be 1 or more")
        if self.lanes < 2 or self.lanes & (self.lanes - 1):
            raise ConfigError(f"lanes {self.lanes} must be a power of two >= 2")
        if self.dataflow == "samples" and self.scratch_entries % self.drain_lanes:
            raise ConfigError(f"build '{self.name}': the dX scratch's {self.scratch_entries} "
                              f"entries must fill its {self.drain_lanes} banks evenly "
                              f"(Build.drain_lanes at {self.lanes} lanes)")
        if self.weight_spram and self.dataflow == "samples":
            # engine v2 reads one weight a cycle for every lane: all of them in one SPRAM
            if self.weight_words * self.lanes > SPRAM_WORDS:
                raise ConfigError(f"build '{self.name}': engine v2 keeps its weights in one "
                                  f"SB_SPRAM256KA of {SPRAM_WORDS} words; weight_words "
                                  f"{self.weight_words} x lanes {self.lanes} = "
                                  f"{self.weight_words * self.lanes}")
        elif self.weight_spram and (self.lanes > SPRAM_BLOCKS or self.weight_words > SPRAM_WORDS):
            raise ConfigError(f"build '{self.name}': weights in SPRAM take one SB_SPRAM256KA per "
                              f"lane and at most {SPRAM_WORDS} words; lanes {self.lanes} (at most "
                              f"{SPRAM_BLOCKS}), weight_words {self.weight_words}")

    @property
    def drain_lanes(self):
        """Engine v2's lanes a cycle out of the lanes' snapshot (ember_hw.sample_engine): the
        input-gradient sums the dX drain writes to the dX scratch and the forward sums the
        writeback requantizes, so that P lanes drain in DX_DRAIN_CYCLES cycles and keep up
        with a group of that many outputs or more (10 classes on 32 lanes: 8 cycles, not
        32); and the samples a requant step takes (ember.dataflow.lane_step). The scratch is
        that many banks, entry e in bank e % drain_lanes."""
        return max(1, self.lanes // DX_DRAIN_CYCLES)

    # Accumulator widths: each as wide as the largest sum this build can form (signed, so
    # one bit more than the magnitude), so no sum overflows and the gateware stays bit-exact
    # with the golden model's exact integers for every network check_network accepts.
    def lane_acc_bits(self):
        """The lanes' accumulators: forward sums over max_width inputs of weight x activation
        and weight-gradient sums over max_batch samples of dY x activation."""
        largest = max(self.max_width, self.max_batch) * (1 << (WEIGHT_BITS - 1)) * ACT_MAX
        return largest.bit_length() + 1

    def dx_acc_bits(self):
        """The input-gradient sum over max_width outputs of weight x dY."""
        largest = self.max_width * (1 << (WEIGHT_BITS - 1)) * (1 << (GRAD_BITS - 1))
        return largest.bit_length() + 1

    def pred_bits(self):
        """The PSG predictor's sums over max_batch samples of the 8-bit dY slice (magnitude
        up to 2**(PSG_GRAD_MSBS - 1)) x the 4-bit activation slice."""
        largest = (self.max_batch * (1 << (PSG_GRAD_MSBS - 1))
                   * ((1 << PSG_ACT_MSBS) - 1))
        return largest.bit_length() + 1

    def blocks(self, width):
        return -(-width // self.lanes)

    def settings(self):
        """The read-write registers (REGISTERS' "rw" entries, in that order) as Settings: the
        one table of their widths and legal ranges on this build."""
        table = (
            Setting("batch", 1, self.max_batch),
            Setting("layers", 1, self.max_layers),
            Setting("update_mask", 0, (1 << self.max_layers) - 1),
            Setting("lr_shift", 0, UPDATE_SHIFT_MAX),
            Setting("flags", 0, (1 << len(FLAG_BITS)) - 1),
            Setting("psg_tau", 0, (1 << 32) - 1, feature="psg"),
            Setting("psg_step_shift", 0, WEIGHT_BITS - 2, feature="psg"),
            Setting("keep_q8", 1, KEEP_ONE, init=KEEP_ONE, feature="ssprop"),
            Setting("lfsr_seed", 1, (1 << 16) - 1, init=1, feature="ssprop_random"),
            Setting("epoch_key", 0, (1 << 32) - 1, feature="resident"),
            Setting("schedule_half", 0, 1, feature="resident"),
            Setting("train_samples", 0, self.data_samples, feature="resident"),
            Setting("test_samples", 0, self.data_samples, feature="resident"),
            Setting("watchdog", 1, self.max_command_cycles(), init=self.max_command_cycles(),
                    feature="watchdog"),
            Setting("infer_program", 0, self.program_words - 1, feature="resident"),
        )
        return {s.name: s for s in table}

    def descriptor_fields(self):
        """The fields of a layer descriptor (LAYER_FIELDS, in that order) as Settings. A base
        holds any word (byte) of its memory; whether the layer then fits is the network
        check's (check_network), which knows the sizes."""
        table = (
            Setting("inputs", 1, self.max_width, init=1),
            Setting("outputs", 1, self.max_width, init=1),
            Setting("weight_base", 0, self.weight_words - 1),
            Setting("act_base", 0, self.act_bytes - 1),
            Setting("shift", 0, FORWARD_SHIFT_MAX),
        )
        return {s.name: s for s in table}

    def feature_mask(self):
        """The FEATURES register's value: bit i set if the build has FEATURES[i]."""
        return sum(1 << i for i, name in enumerate(FEATURES) if name in self.features)

    def sample_blocks(self, batch):
        """Engine v2 (dataflow "samples"): the batch's blocks of P samples."""
        return -(-batch // self.lanes)

    def weight_words_needed(self, layers):
        """Weight words a network occupies: ceil(N/P) blocks of K words per layer (v2: one
        weight after another, P to a word)."""
        if self.dataflow == "samples":
            return -(-sum(k * n for k, n in zip(layers[:-1], layers[1:])) // self.lanes)
        return sum(self.blocks(n) * k for k, n in zip(layers[:-1], layers[1:]))

    def act_bytes_needed(self, layers, batch):
        """Activation bytes for a batch: every layer's input for every sample (v2: for every
        lane of every sample block)."""
        if self.dataflow == "samples":
            return self.sample_blocks(batch) * self.lanes * sum(layers[:-1])
        return batch * sum(layers[:-1])

    def grad_words_needed(self, layers, batch):
        """Gradient words: two halves, each the widest layer output's dY for the batch (v2:
        a word per output and sample block)."""
        if self.dataflow == "samples":
            return 2 * self.sample_blocks(batch) * max(layers[1:])
        return 2 * batch * max(self.blocks(n) for n in layers[1:])

    def scratch_needed(self, layers, batch):
        """dX scratch entries: the widest hidden layer for the batch (0 for one layer; v2:
        for every lane of every sample block)."""
        if self.dataflow == "samples":
            return self.sample_blocks(batch) * self.lanes * max(layers[1:-1], default=0)
        return batch * max(layers[1:-1], default=0)

    def max_command_cycles(self):
        """An upper bound on the cycles of any train or infer command this build accepts: the
        bound of command_cycle_bound for the largest command the registers can describe
        (max_layers layers, every width max_width, batch max_batch), memory limits ignored.
        Every term of that bound grows with each width, the batch and the layer count, so it
        bounds every legal command; it sizes the command watchdog's limit register."""
        layers = [self.max_width] * (self.max_layers + 1)
        return max(command_cycle_bound(self, layers, self.max_batch, train=train)
                   for train in (True, False))


BUILDS = {
    # The simulated board's build (`make train`, the CLI's default): engine v2
    # (docs/architecture.md 2b, ember_hw.sample_core), 32 lanes over the samples of a batch
    # with every unit, on the model backend and the simulated board. 32 lanes, as the ULX3S:
    # a batch of 32 takes a third of the cycles it takes on 8 lanes, while Verilator spends
    # only about a quarter more time per cycle on the wider design (docs/architecture.md 5),
    # so the simulated board trains faster. Its memories hold what the 8-lane build's held
    # (32 K weights and gradients). Its resident data memory (docs/protocol.md section 11)
    # holds the digits' 1,797 x 64 input bytes and their labels.
    "sim": Build(lanes=32, weight_words=1024, grad_words=1024, dataflow="samples",
                 features=FEATURES, data_bytes=1 << 17, data_samples=2048),
    # Engine v1 (ember_hw.engine) at the default sizes (8 lanes) with every unit but resident
    # data: the boards' engine until v2 takes them, kept on the model backend and the
    # simulated board for v1's tests.
    "v1": Build(name="v1"),
    # The UP5K's 5,280 logic cells set this build (docs/boards.md, "iCEBreaker"): engine v2
    # (docs/architecture.md 2b) on two lanes with every weight in one SPRAM (16K weights; the
    # other three SPRAMs are free for resident data), layers up to 64 wide and 3 deep,
    # batches up to 16, and no PSG or ssProp units. 64-32-10 on digits needs 2,368 weights,
    # 1,536 activation bytes, 512 gradient words and 512 dX entries at batch 16. Its program
    # memory is 512 words (4 block RAMs): digits' 64-32-10 train program needs 263, the
    # largest network at these sizes 495 (no psg_max phases without the PSG unit).
    # 3 Mbaud: 8 cycles of 24 MHz per bit (exact) and 12 MHz / 4 on the FT2232H; 6 Mbaud
    # (4 cycles, ember_hw.uart.MIN_DIVISOR) would put the receiver's one sample per bit
    # anywhere from 50 to 75 % into the bit (docs/boards.md, "The link").
    "icebreaker": Build(name="icebreaker", lanes=2, weight_words=SPRAM_WORDS // 2,
                        act_bytes=2048, grad_words=512, scratch_entries=512, max_batch=16,
                        max_layers=3, max_width=64, clock_hz=24_000_000, baud=3_000_000,
                        weight_spram=True, program_words=512, features=("zero_skip", "slu"),
                        dataflow="samples"),
    # a small build for fast RTL tests (Icarus included) and the CI bitstream of the ULX3S
    # flow (tests/test_bitstream.py): it routes at 47 to 57 MHz on the ECP5-85F, so 40 MHz
    # leaves margin for other nextpnr versions; 2 Mbaud is 20 cycles of 40 MHz and a rate the
    # ULX3S's FT231X makes (3 Mbaud would be 13.3 cycles per bit: 2.6 % off with 13)
    "tiny": Build(name="tiny", lanes=4, weight_words=512, act_bytes=1024, grad_words=128,
                  scratch_entries=256, max_batch=8, max_layers=4, max_width=64,
                  clock_hz=40_000_000, baud=2_000_000),
    # Engine v2 at 32 lanes with every unit (docs/boards.md, "Session 14"). 30 MHz: v1's
    # clock on this board; the aim is 100 MHz.
    # 1024 weight words of 32 weights (32 K weights; 784-32-10 needs 816 words): one weight
    # memory of 32,768 x 16 bits in block RAM. 3 Mbaud, the FT231X's fastest rate: 10 cycles
    # of 30 MHz per bit.
    "ulx3s": Build(name="ulx3s", lanes=32, weight_words=1024, act_bytes=16384,
                   grad_words=1024, scratch_entries=8192, max_batch=64, max_width=1024,
                   clock_hz=30_000_000, baud=3_000_000, dataflow="samples",
                   features=FEATURES, data_bytes=1 << 17, data_samples=2048),
}


def with_dataflow(build, dataflow):
    """`build` on the other engine (DATAFLOWS), named "<name>-<dataflow>": its sizes and units,
    and on engine v2 with weight_spram its weights cut to fit one SPRAM (v2 keeps every weight
    in one SB_SPRAM256KA: weight_words * lanes <= SPRAM_WORDS). The board builds' and the
    simulated board's --dataflow. Engine v1 has no resident data unit: a build's is left
    out on v1."""
    if dataflow == build.dataflow:
        return build
    words = build.weight_words
    if build.weight_spram and dataflow == "samples":
        words = min(words, SPRAM_WORDS // build.lanes)
    resident = {}
    if dataflow != "samples" and "resident" in build.features:
        resident = dict(features=tuple(f for f in build.features if f != "resident"),
                        data_bytes=0, data_samples=0)
    return replace(build, name=f"{build.name}-{dataflow}", dataflow=dataflow,
                   weight_words=words, **resident)

DEFAULT_BUILD = BUILDS["sim"]
#: The boards with a top in ember_boards (ember_boards.<board>); BUILDS[board] is each one's
#: own build, and its baud the rate of the board's bitstream.
BOARDS = ("icebreaker", "ulx3s")


def board_bauds():
    """{board: baud of its own build}: the rates of Ember's board bitstreams."""
    return {board: BUILDS[board].baud for board in BOARDS}


class ConfigError(ValueError):
    """A configuration, data set or setting that this build cannot take. The message names
    the offending value and the limit; nothing on the device has been changed."""


def _check_shape(layers, build, batch=None):
    """Raise ConfigError unless the registers of `build` can describe `layers` (widths, input
    first) and `batch` (if given): the layer count, each width and the batch size, memories
    aside. Returns the widths as a list."""
    layers = list(layers)
    if len(layers) < 2:
        raise ConfigError(f"a network needs at least 2 widths (input and output); got {layers}")
    if len(layers) - 1 > build.max_layers:
        raise ConfigError(f"network {layers} has {len(layers) - 1} layers; build "
                          f"'{build.name}' holds at most {build.max_layers}")
    for i, w in enumerate(layers):
        if not isinstance(w, int) or w < 1:
            raise ConfigError(f"width {i} of {layers} is {w!r}; widths are positive integers")
        if w > build.max_width:
            raise ConfigError(f"width {i} of {layers} is {w}; build '{build.name}' holds at "
                              f"most {build.max_width} per layer")
    if batch is not None and (not isinstance(batch, int) or not 1 <= batch <= build.max_batch):
        raise ConfigError(f"batch size {batch!r} is outside 1..{build.max_batch} "
                          f"(build '{build.name}')")
    return layers


def check_network(layers, build=DEFAULT_BUILD, batch=None):
    """Raise ConfigError unless `layers` (widths, input first) fits `build`."""
    layers = _check_shape(layers, build, batch)
    if layers[-1] < 2:
        raise ConfigError(f"the output layer has {layers[-1]} neurons; classification needs 2 "
                          "or more")
    words = build.weight_words_needed(layers)
    if words > build.weight_words:
        raise ConfigError(f"network {layers} needs {words} weight words; build '{build.name}' "
                          f"holds {build.weight_words} (lanes={build.lanes})")
    if batch is not None:
        need = build.act_bytes_needed(layers, batch)
        if need > build.act_bytes:
            raise ConfigError(f"network {layers} with batch {batch} needs {need} activation "
                              f"bytes; build '{build.name}' holds {build.act_bytes}")
        need = build.grad_words_needed(layers, batch)
        if need > build.grad_words:
            raise ConfigError(f"network {layers} with batch {batch} needs {need} gradient "
                              f"words; build '{build.name}' holds {build.grad_words}")
        need = build.scratch_needed(layers, batch)
        if need > build.scratch_entries:
            raise ConfigError(f"network {layers} with batch {batch} needs {need} dX scratch "
                              f"entries; build '{build.name}' holds {build.scratch_entries}")
    if build.dataflow == "samples":
        from . import dataflow
        need = dataflow.program_words_needed(layers, build, batch)
        if need > build.program_words:
            raise ConfigError(f"network {layers}{'' if batch is None else f' with batch {batch}'}"
                              f" needs a program of {need} words; build '{build.name}' "
                              f"holds {build.program_words}")
    return layers


def check_features(needed, build):
    """Raise ConfigError unless `build` has every unit in `needed` (names from FEATURES)."""
    missing = [name for name in needed if name not in build.features]
    if missing:
        have = ", ".join(build.features) or "none"
        raise ConfigError(f"the settings need the {' and '.join(missing)} unit"
                          f"{'s' if len(missing) > 1 else ''}; build '{build.name}' has "
                          f"only: {have}")


@dataclass(frozen=True)
class StepSettings:
    """Per-batch settings of a training step (what the host writes before each batch).

    update_mask:    per layer, True if its weights are updated this batch (SLU); None = all.
    lr_shift:       SGD: dW = round(G >> (lr_shift + gradient-scale correction)).
    zero_skip:      skip MAC cycles whose broadcast operand is zero.
    psg:            predictive sign gradient instead of SGD.
    psg_relative:   the threshold is max|G_pred| >> psg_tau instead of psg_tau itself.
    psg_tau:        absolute threshold (predictor units) or relative shift.
    psg_step_shift: sign update step is 2**psg_step_shift weight LSBs.
    keep_q8:        ssProp keep ratio * 256; KEEP_ONE (256) is dense.
    ssprop_random:  keep random channels (LFSR scores) instead of the largest |dY| sums.
    lfsr_seed:      seed of the random variant's LFSR for this batch (1..65535).
    """
    update_mask: tuple | None = None
    lr_shift: int = 10
    zero_skip: bool = False
    psg: bool = False
    psg_relative: bool = False
    psg_tau: int = 0
    psg_step_shift: int = 4
    keep_q8: int = KEEP_ONE
    ssprop_random: bool = False
    lfsr_seed: int = 1

    def needs(self):
        """The optional units (FEATURES) a step with these settings uses."""
        used = {"zero_skip": self.zero_skip,
                "slu": self.update_mask is not None and not all(self.update_mask),
                "psg": self.psg,
                "ssprop": self.keep_q8 < KEEP_ONE,
                "ssprop_random": self.keep_q8 < KEEP_ONE and self.ssprop_random}
        return tuple(name for name in FEATURES if used.get(name))

    def check(self, n_layers, build=None):
        """Raise ConfigError naming the first value out of its range, or the first unit the
        settings need that `build` (if given) does not have."""
        if build is not None:
            check_features(self.needs(), build)
        if self.update_mask is not None and len(self.update_mask) != n_layers:
            raise ConfigError(f"update_mask has {len(self.update_mask)} entries; the network "
                              f"has {n_layers} layers")
        # the registers' legal ranges (Build.settings: the same table the engine is built from)
        table = (build or DEFAULT_BUILD).settings()
        for name in ("lr_shift", "psg_step_shift", "psg_tau", "keep_q8", "lfsr_seed"):
            value, setting = getattr(self, name), table[name]
            if not setting.contains(value):
                raise ConfigError(f"{name} {value} is outside {setting.lo}..{setting.hi}")
            if name == "psg_tau" and self.psg_relative and self.psg_tau > 63:
                raise ConfigError(f"relative psg_tau (a shift) {self.psg_tau} is outside 0..63")
        return self

    def mask(self, n_layers):
        """The update mask as a tuple of bools, one per layer (input side first)."""
        return tuple(True for _ in range(n_layers)) if self.update_mask is None \
            else tuple(bool(m) for m in self.update_mask)


# --- Link and bus ---------------------------------------------------------------------------------
#: The engine's bus: word addresses and 32-bit data words.
BUS_ADDR_BITS = 24
BUS_DATA_BITS = 32
#: Most data words one READ or WRITE frame carries (the bridge buffers a whole frame before it
#: touches the bus, so a corrupted frame changes nothing).
LINK_MAX_WORDS = 256
#: Response status codes (first byte of every response payload).
LINK_STATUS = {
    "ok": 0x00,
    "bad_crc": 0x01,
    "bad_length": 0x02,
    "unknown_command": 0x03,
    "out_of_range": 0x04,
    "busy": 0x05,
    "bad_value": 0x06,
    "duplicate": 0x07,
    "aborted": 0x08,
    "watchdog": 0x09,
    # engine v2: the core refused the program part way (an address outside a memory, an
    # unknown phase kind, a bound of 0: ember_hw.sample_engine)
    "fault": 0x0A,
}
#: Bits of a status code: a response's first byte, and the error word's low bits on the bus.
LINK_STATUS_BITS = 8
assert max(LINK_STATUS.values()) < 1 << LINK_STATUS_BITS
#: Labels (in) and predictions (out) are 16-bit values, two per bus word.
LABEL_BITS = 16
#: Request commands.
LINK_COMMANDS = {"read": 0x01, "write": 0x02}
#: Bits on the line per byte (8N1: a start bit, 8 data bits, a stop bit).
UART_FRAME_BITS = 10


# --- Engine address map (bus word addresses) -----------------------------------------------------
#: Regions of the engine's bus address space: name -> (base word address, size in words).
#: Weights pack two 16-bit lanes per word (word w, lane p at (w * lanes + p) // 2, low half first);
#: activations four bytes per word (input batch: byte b * K + k); labels and predictions two
#: 16-bit values per word. Engine v2 (Build.dataflow "samples"): weight i (W[j, k] of layer l
#: at wbase_l + j * K + k, ember.dataflow.layout) in the halves of word i // 2; the input batch's
#: byte of sample b = s * P + p, input k at (s * K + k) * P + p; the program region.
REGION_BITS = 20
ADDRESS_MAP = {
    "regs": (0x000000, 0x1000),
    "counters": (0x001000, 0x1000),
    "weights": (0x100000, 1 << REGION_BITS),
    "acts": (0x200000, 1 << REGION_BITS),
    "labels": (0x300000, 1 << REGION_BITS),
    "predictions": (0x400000, 1 << REGION_BITS),
    # engine v2: the program memory, one 32-bit word each (ember.dataflow.encode)
    "program": (0x500000, 1 << REGION_BITS),
    # resident data (feature "resident", docs/protocol.md section 11): an epoch's schedule
    # word per mini-batch (SCHEDULE_*), the splits' input bytes (sample i's byte k at byte
    # i * K + k, four to a word; the test split after the training split) and their labels
    # (two 16-bit labels per word, in the same sample order)
    "schedule": (0x600000, 1 << REGION_BITS),
    "data": (0x700000, 1 << REGION_BITS),
    "data_labels": (0x800000, 1 << REGION_BITS),
}
#: Registers (word offsets in the "regs" region). "ro" registers describe the build.
REGISTERS = {
    "id": (0x00, "ro"),            # ENGINE_ID
    "version": (0x01, "ro"),       # ENGINE_VERSION
    "lanes": (0x02, "ro"),
    "weight_words": (0x03, "ro"),
    "act_bytes": (0x04, "ro"),
    "grad_words": (0x05, "ro"),
    "scratch_entries": (0x0A, "ro"),
    "max_batch": (0x06, "ro"),
    "max_layers": (0x07, "ro"),
    "max_width": (0x08, "ro"),
    "counters": (0x09, "ro"),      # number of counters
    "features": (0x0B, "ro"),      # bit i: the build has FEATURES[i]
    "baud": (0x0C, "ro"),          # Build.baud: the UART rate of the board top (bits/s)
    "dataflow": (0x0D, "ro"),      # DATAFLOWS.index(Build.dataflow): the memories' layout
    "data_bytes": (0x0E, "ro"),    # Build.data_bytes: the resident data memory (0: none)
    "data_samples": (0x0F, "ro"),  # Build.data_samples: resident samples with a label
    "control": (0x10, "wo"),       # CONTROL_* bits: start a command
    "status": (0x11, "ro"),        # bit 0 busy
    "correct": (0x12, "ro"),       # samples the last training batch classified correctly
    "batch": (0x18, "rw"),
    "layers": (0x19, "rw"),
    "update_mask": (0x1A, "rw"),
    "lr_shift": (0x1B, "rw"),
    "flags": (0x1C, "rw"),         # FLAG_* bits
    "psg_tau": (0x1D, "rw"),
    "psg_step_shift": (0x1E, "rw"),
    "keep_q8": (0x1F, "rw"),
    "lfsr_seed": (0x20, "rw"),
    "epoch_key": (0x21, "rw"),     # the order key of the next EPOCH (schedule.epoch_order),
    #                                beside the settings: one burst per epoch writes both
    "schedule_half": (0x22, "rw"),  # the schedule half the next EPOCH reads (schedule_half_
    #                                 words): the host writes the other one while it runs
    "train_samples": (0x23, "rw"),  # resident training samples (0: no data loaded)
    "test_samples": (0x24, "rw"),  # resident test samples, after the training split
    "watchdog": (0x25, "rw"),      # the cycles one command may run (Setting "watchdog")
    "infer_program": (0x26, "rw"),  # the program word INFER and EVALUATE start at (TRAIN and
    #                                 EPOCH at 0): the train and infer programs side by side
    "rejected": (0x13, "ro"),      # 1 + the COMMAND_CHECKS index the last command failed; 0
    "stopped": (0x14, "ro"),       # what the last command left if it was stopped: STOP_FIELDS
    "test_correct": (0x15, "ro"),  # test samples the last EVALUATE classified correctly
}
#: Layer descriptor l lives at LAYER_BASE + l * LAYER_STRIDE + field offset.
LAYER_BASE = 0x40
LAYER_STRIDE = 8
LAYER_FIELDS = ("inputs", "outputs", "weight_base", "act_base", "shift")
ENGINE_ID = 0x454D4252          # "EMBR"
ENGINE_VERSION = 9              # 3: writes and commands checked in the engine (bad_value);
                                # 4: abort, watchdog, the link answers while a command runs;
                                # 5: the BAUD register; 6: resident data (its registers,
                                # regions and the EPOCH and EVALUATE commands); 7: the
                                # data_reads counter; 8: EPOCH_KEY at 0x21, WATCHDOG at 0x24;
                                # 9: SCHEDULE_HALF at 0x22 (the schedule's two halves)


def read_only_values(build):
    """The value of each read-only register of `build` that describes it (not STATUS,
    CORRECT, REJECTED nor STOPPED, which the engine drives): the register bank's constants
    (ember_hw.regbank) and the virtual engine's (ember.virtual)."""
    return {
        "id": ENGINE_ID, "version": ENGINE_VERSION, "lanes": build.lanes,
        "weight_words": build.weight_words, "act_bytes": build.act_bytes,
        "grad_words": build.grad_words, "scratch_entries": build.scratch_entries,
        "max_batch": build.max_batch, "max_layers": build.max_layers,
        "max_width": build.max_width, "counters": len(COUNTERS),
        "features": build.feature_mask(), "baud": build.baud,
        "dataflow": DATAFLOWS.index(build.dataflow),
        "data_bytes": build.data_bytes, "data_samples": build.data_samples,
    }


#: The checks a train or infer command passes before it starts, in the order the engine makes
#: them (ember_hw.stepcheck.StepCheck; the model: check_command). "layers" and "batch" first;
#: then, layer by layer from the input side, "chain", "weights" and "acts"; then the rest.
#: (No width is ever 0: descriptor fields refuse 0 and start at 1.) A command that fails one is answered `bad_value` at CONTROL's address and changes
#: nothing; REJECTED then reads 1 + the failed check's index (0 after a command that passed).
COMMAND_CHECKS = {
    "layers": "the layer count is 0 (no network configured)",
    "batch": "the batch size is 0",
    "chain": "a layer's inputs differ from the outputs of the layer below it",
    "weights": "a layer's weights do not start where the layer below's end (layer 0's at "
               "word 0), or run past the weight memory",
    "acts": "a layer's input activations do not start where the layer below's end (layer "
            "0's at byte 0), or run past the activation memory",
    "classes": "the output layer has fewer than 2 outputs (classes)",
    "grads": "the batch's output gradients need more words than the gradient memory holds",
    "scratch": "the batch's input gradients need more entries than the dX scratch holds",
    "labels": "a label of the batch has not been written since the class count last changed",
    "program": "engine v2: the program memory holds a program the engine will not run (the "
               "engine: one dataflow.verify refuses; the model: any but the one the host "
               "compiles for the network and batch in the registers)",
    "data": "resident data: no training split is loaded (train_samples 0; for EVALUATE no "
            "test split, test_samples 0), or the splits at the network's input width need more "
            "than the data memory's bytes or labels",
}


def check_command(build, regs, layer_fields, train, labels_written):
    """The first of COMMAND_CHECKS a train (`train` true) or infer command fails, or None.

    regs: the read-write registers ({name: value}); layer_fields: per layer, {field: value}
    (spec.LAYER_FIELDS); labels_written: a bit mask, bit w set if label word w (labels 2w and
    2w + 1) has been written since the class count last changed."""
    n, batch = regs["layers"], regs["batch"]
    if n == 0:
        return "layers"
    if batch == 0:
        return "batch"
    widest_blocks = widest_hidden = 0
    weights_end = acts_end = 0          # where the layer below's weights and inputs end
    for l in range(n):
        d = layer_fields[l]
        k, out = d["inputs"], d["outputs"]
        if l > 0 and k != layer_fields[l - 1]["outputs"]:
            return "chain"
        if build.dataflow == "samples":
            # engine v2: the program says where everything is, and the core checks every
            # address it forms against its memory (ember_hw.sample_engine)
            continue
        # the layers packed as the host lays them out (regmap.layout), nothing between them
        if d["weight_base"] != weights_end or \
                d["weight_base"] + build.blocks(out) * k > build.weight_words:
            return "weights"
        if d["act_base"] != acts_end or d["act_base"] + batch * k > build.act_bytes:
            return "acts"
        weights_end = d["weight_base"] + build.blocks(out) * k
        acts_end = d["act_base"] + batch * k
        widest_blocks = max(widest_blocks, build.blocks(out))
        if l < n - 1:
            widest_hidden = max(widest_hidden, out)
    if layer_fields[n - 1]["outputs"] < 2:
        return "classes"
    if build.dataflow == "samples":
        pass
    elif 2 * batch * widest_blocks > build.grad_words:
        return "grads"
    elif batch * widest_hidden > build.scratch_entries:
        return "scratch"
    needed = (1 << (batch + 1) // 2) - 1
    if train and labels_written & needed != needed:
        return "labels"
    return None


#: Input bytes per word of the resident data memory: a sample starts on a word.
DATA_WORD_BYTES = BUS_DATA_BITS // ACT_BITS


def sample_data_bytes(inputs):
    """The bytes one resident sample of `inputs` inputs takes in the data memory: its inputs
    padded to a whole word (docs/protocol.md section 11), so that the gather reads four of
    its inputs per data word."""
    return DATA_WORD_BYTES * -(-inputs // DATA_WORD_BYTES)


def sample_data_words(inputs):
    """The data words one resident sample of `inputs` inputs takes (sample_data_bytes): the
    gather's `data_reads` for each sample of a batch."""
    return sample_data_bytes(inputs) // DATA_WORD_BYTES


def check_resident(build, regs, layer_fields, epoch, evaluate):
    """The first of COMMAND_CHECKS an EPOCH (`epoch` true) and/or EVALUATE (`evaluate`)
    command fails, or None: an infer command's checks of the network and batch
    (check_command), then "data": the split it walks is loaded and both splits fit the data
    memory at layer 0's input width. A build without the resident unit holds no split
    (train_samples and test_samples read 0), so it refuses both with "data"."""
    failed = check_command(build, regs, layer_fields, False, 0)
    if failed is not None:
        return failed
    n_train, n_test = regs.get("train_samples", 0), regs.get("test_samples", 0)
    if epoch and n_train == 0 or evaluate and n_test == 0:
        return "data"
    samples = n_train + n_test
    if (samples * sample_data_bytes(layer_fields[0]["inputs"]) > build.data_bytes
            or samples > build.data_samples):
        return "data"
    return None


# --- Cycle bound of one command (for a watchdog) -----------------------------------------------
#: Cycles of one sample in the loss unit (ember_hw.loss.SoftmaxGradUnit.cycles), beyond 3 per
#: class: its restoring divider's steps (one per quotient bit of floor(2**RECIP_BITS / S),
#: S >= EXP2_TABLE[0]) and 6 cycles of pipeline.
LOSS_UNIT_EXTRA_CYCLES = (RECIP_BITS - (EXP2_TABLE[0].bit_length() - 1) + 1) + 6
#: The sequencer's phase counters (COUNTERS) that command_cycle_bounds bounds, one bound per
#: group (the weight-gradient pass and its updates overlap, so they share one).
CYCLE_PHASES = (("cycles_forward",), ("cycles_loss",), ("cycles_select",),
                ("cycles_input_grad",), ("cycles_weight_grad", "cycles_update"))


def command_cycle_bounds(build, layers, batch, train=True, settings=None):
    """Upper bounds on the busy cycles of one command, per group of phase counters
    (CYCLE_PHASES -> cycles): what the engine's sequencer (ember_hw.engine, FSM "seq") can
    take at most in the states each group counts, for the network `layers` (widths, input
    first) at batch `batch` on `build`. Their sum bounds the `cycles` counter's increase.

    settings None: valid for every StepSettings the build's units can take (zero skip, any
    update_mask, PSG absolute or relative with any psg_tau, any keep_q8 with top-k or random
    selection) and any data. A StepSettings: valid for that step's settings and any data
    (tighter: no PSG or ssProp terms unless the step uses them, no pass the update mask
    leaves out).

    Notation: P = build.lanes; B = batch; per layer l (input side first) K = layers[l],
    N = layers[l + 1], nb = ceil(N / P); M = the serial multiplier's steps, the bits of a
    layer width (descriptor field "inputs"); N_top = the classes.
    Each bound below is the largest number of cycles of its states; data-dependent states
    are taken at their longest (zero skipping shortens only IG_RUN; PSG and ssProp terms are
    their worst case), waits on a unit at the unit's longest (its docstring's timing):

    cycles_forward (DESC_FWD, FWD_*, AFTER_FWD; INF_* in an infer command):
      per layer:  7 (DESC_FWD: 6 descriptor words, one a cycle, and the switch)
                + 1 for layer 0, else max(1, P - 2) (FWD_LAYER: the writeback unit's last
                  block of the layer below, busy P + 4 cycles from its hand-over, 8 cycles
                  earlier)
                + K + 6 + (B * nb - 1) * max(K + 6, P + 5), per block: FWD_ROW 1, FWD_RUN
                  K + 4 (K reads and a 4-stage pipeline), FWD_HANDOFF 1; a hand-over but
                  the layer's first waits for the writeback unit's previous block
                  (ember_hw.writeback: hand-overs P + 5 cycles apart)
      then:       P + 5 (FWD_END: the last block's writeback) + 1 (AFTER_FWD)
      infer:      + B * (N_top + 4) (INF_ROW 1, INF_RUN N_top + 2, INF_WRITE 1 per sample)
    cycles_loss (train; LOSS_*): B * (3 + 3 * N_top + LOSS_UNIT_EXTRA_CYCLES): LOSS_START,
      LOSS_GO, LOSS_GO2, then the loss unit's 3 passes over the logits, its divider and
      pipeline (ember_hw.loss: 3N + 23 from start to done).
    cycles_select (train; DESC_BWD, BWD_*, SCORE_*, SELECT*, PACK, BWD_NEXT), per layer:
                  7 (DESC_BWD; not for the output layer) + 1 (BWD_LAYER) + 4 * (M + 1)
                  (BWD_KEEP, BWD_BK, BWD_BNK, BWD_LAYER2: four serial products of M steps,
                  each done M + 1 cycles after its start) + 1 (BWD_NEXT)
      ssProp (keep_q8 < KEEP_ONE, when the layer runs a pass), the longer variant:
        top-k:    B * N + 2 (SCORE_TOPK: one dY a cycle, 2-stage pipeline)
                + (S + 1) * (N + 1) + 2 (SELECT, SELECT_WAIT: the selector's S search
                  passes and its fill pass of N + 1 cycles each; ember_hw.select), where
                  S = bits(B * 2**(GRAD_BITS - 1)) + 1 (a score sums B magnitudes of
                  16-bit dY; the search visits its first bit, then each bit from the
                  scores' highest down)
                + N + 1 (PACK)
        random:   N + 1 (SCORE_RANDOM) + the same SELECT and PACK with S = LFSR bits + 1
    cycles_input_grad (train; IG_*, REQ_*), per layer that runs a pass: 1 (IG_START);
      per layer l >= 1 whose input gradient runs (some layer below it is updated):
                  1 (IG_A) + B * K * nb (IG_RUN: one slot per block of each (b, k); a zero
                  activation, when skipping, takes 1 instead) + 6 (IG_DRAIN: 5 stages)
                + 1 (REQ_START) + B * K + 5 (REQ_RUN: one dX a cycle, 4-stage pipeline)
    cycles_weight_grad + cycles_update (train; WG_*, PSG_*, UPD_HANDOFF, WG_WAIT), per
      layer that runs a pass: 1 (WG_START); per updated layer:
                  3 * nb (WG_BLOCK, WG_BLOCK2, WG_NEXT_BLOCK)
                + path + (nb - 1) * max(path, P + 5) + nb * (K - 1) * max(path, P + 8):
                  each (j, k) is handed to the update unit, whose hand-overs are P + 8
                  cycles apart (ember_hw.update); a (j, k) takes WG_K 1, WG_FULL B + 4 (a
                  4-stage pipeline over the batch), UPD_HANDOFF 1: path = B + 6 (with PSG,
                  WG_LOW B + 4 and PSG_DECIDE 1 before, and the recompute of uncertain
                  lanes: path = 2 * B + 11), and its hand-over waits out the rest of the P + 8
                  cycles since the last: none for the first, up to P + 5 - path after the 3
                  block states of a new block, P + 8 - path within a block; ssProp's empty
                  blocks take their 3 states and no (j, k), so the worst is every block kept,
                  and with a step's keep ratio nb is min(nb, kept channels) in the (j, k)
                  terms here and below
                + P + 7 (WG_WAIT: the last update)
      PSG relative (its first pass finds the largest |prediction|):
                + 3 * nb + nb * K * (B + P + 7) (WG_K 1, WG_LOW B + 4, PSG_DECIDE 1,
                  PSG_MAX P, WG_NEXT_K 1)

    No state waits on anything but these units and counters, and every loop runs a count
    fixed by the widths and the batch, so no legal command runs longer. For a dense step
    (no PSG, no ssProp, every layer updated, zero skip off) and for inference every term is
    exact: with `settings` the bound equals the command's cycles; without, the PSG and
    ssProp worst cases are included (relative PSG with tau 0 recomputes every lane after
    its extra pass: about 3 times the dense weight-gradient pass at batch 16, and 2.1 times
    a dense step of 64-32-10, which no bound for every setting can be below). Plain integer
    arithmetic, no numpy.
    """
    layers = _check_shape(layers, build, batch)
    P, B = build.lanes, batch
    n_layers = len(layers) - 1
    M = build.descriptor_fields()["inputs"].bits
    has = set(build.features)
    if settings is None:
        wgrad = [True] * n_layers
        igrad = [l > 0 for l in range(n_layers)]
        psg, psg_relative = "psg" in has, "psg" in has
        ssprop, ssprop_random = "ssprop" in has, "ssprop_random" in has
        topk = ssprop
    else:
        mask = settings.mask(n_layers)
        wgrad = list(mask)
        igrad = [l > 0 and any(mask[:l]) for l in range(n_layers)]
        psg, psg_relative = settings.psg, settings.psg and settings.psg_relative
        ssprop = settings.keep_q8 < KEEP_ONE
        ssprop_random = ssprop and settings.ssprop_random
        topk = ssprop and not settings.ssprop_random

    def select_passes(largest_score):
        # the selector's first pass, then one per bit from the scores' highest down to bit 0
        return largest_score.bit_length() + 1

    forward = loss = select = input_grad = weight_grad = 0
    for l in range(n_layers):
        K, N = layers[l], layers[l + 1]
        nb = build.blocks(N)
        # blocks with a kept channel: with a step's keep ratio, at most one per kept channel
        kept_blocks = nb
        if settings is not None and ssprop:
            kept_blocks = min(nb, max(1, N * settings.keep_q8 >> (KEEP_ONE.bit_length() - 1)))
        forward += 7 + (1 if l == 0 else max(1, P - 2)) + K + 6 \
            + (B * nb - 1) * max(K + 6, P + 5)
        if not train:
            continue
        select += (7 if l < n_layers - 1 else 0) + 1 + 4 * (M + 1) + 1
        if not (wgrad[l] or igrad[l]):
            continue
        if ssprop:
            chosen = []
            if topk:
                s = select_passes(B << (GRAD_BITS - 1))
                chosen.append(B * N + 2 + (s + 1) * (N + 1) + 2 + N + 1)
            if ssprop_random:
                s = select_passes((1 << LFSR_TAPS.bit_length()) - 1)
                chosen.append(N + 1 + (s + 1) * (N + 1) + 2 + N + 1)
            select += max(chosen)
        input_grad += 1
        if igrad[l]:
            input_grad += 1 + B * K * nb + 6 + 1 + B * K + 5
        weight_grad += 1            # WG_START, which ends a layer of input gradient only
        if wgrad[l]:
            path = 2 * B + 11 if psg else B + 6
            weight_grad += 3 * nb + path + (kept_blocks - 1) * max(path, P + 5) \
                + kept_blocks * (K - 1) * max(path, P + 8) + P + 7
            if psg_relative:
                weight_grad += 3 * nb + kept_blocks * K * (B + P + 7)
    forward += P + 5 + 1
    if train:
        loss = B * (3 + 3 * layers[-1] + LOSS_UNIT_EXTRA_CYCLES)
    else:
        forward += B * (layers[-1] + 4)
    return dict(zip(CYCLE_PHASES, (forward, loss, select, input_grad, weight_grad)))


def command_cycle_bound(build, layers, batch, train=True, settings=None):
    """An upper bound on the cycles (the `cycles` counter's increase, busy cycles) of one
    train (`train` true) or infer command of the network `layers` at batch `batch` on
    `build`: the sum of command_cycle_bounds, whose docstring gives the formula per phase.
    settings None: valid for every step setting and any data; a StepSettings: for that
    step's settings. Raises ConfigError for a shape or batch the build's registers cannot
    hold (memory limits are not checked: check_network does). On a samples build (engine
    v2) the bound is ember.dataflow.command_cycle_bound's, from the program the host
    compiles."""
    if build.dataflow == "samples":
        from . import dataflow
        return dataflow.command_cycle_bound(build, _check_shape(layers, build, batch), batch,
                                            train, settings)
    return sum(command_cycle_bounds(build, layers, batch, train, settings).values())


CONTROL_TRAIN = 1
CONTROL_INFER = 2
CONTROL_CLEAR_COUNTERS = 4
#: Resident data (feature "resident"): train one epoch over the resident training split, the
#: batches of the schedule region in the order epoch_key gives; then CORRECT holds the
#: trained samples the forward passes classified correctly.
CONTROL_EPOCH = 16
#: Resident data: infer the resident test split (batches of max_batch, the last short); then
#: TEST_CORRECT holds how many it classified correctly. With CONTROL_EPOCH in the same write,
#: after the epoch.
CONTROL_EVALUATE = 32
#: Stop the running command (docs/protocol.md section 10). Answered at once, even while a
#: command runs; the command's own answer then says whether it stopped (`aborted`) or had
#: already written weights and ran to its end (`ok`). While no command runs it does nothing.
#: A CONTROL word with this bit is an abort, whatever its other bits.
CONTROL_ABORT = 8
#: The STOPPED register (read only): name -> (lowest bit, bits). All 0 after a command that ran
#: to its end. stopped: the last command did not; watchdog: the watchdog stopped it (it had
#: run `watchdog` cycles), else an abort did; weights_changed: it had written weights when it
#: stopped (only a watchdog stop can leave them so): the layers above `layer` have the
#: command's update, `layer` may have part of it, the layers below it have none of it
#: (`layer` is 0 without weights_changed).
STOP_FIELDS = {"stopped": (0, 1), "watchdog": (1, 1), "weights_changed": (2, 1),
               "layer": (8, 8)}


def stop_fields(word):
    """STOPPED's value -> {field: value} (STOP_FIELDS)."""
    return {name: (word >> lo) & ((1 << bits) - 1) for name, (lo, bits) in STOP_FIELDS.items()}
FLAG_BITS = ("zero_skip", "psg", "psg_relative", "ssprop_random")


# the tables of Build.settings and Build.descriptor_fields name exactly the registers above
assert tuple(DEFAULT_BUILD.settings()) == tuple(n for n, (_, mode) in REGISTERS.items()
                                                if mode == "rw")
assert tuple(DEFAULT_BUILD.descriptor_fields()) == LAYER_FIELDS
assert len(LAYER_FIELDS) <= LAYER_STRIDE
