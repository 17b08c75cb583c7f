"""Engine v2's dataflow: the MAC lanes over the samples of a batch, the weight broadcast
(issue 13, items 2 and 3; docs/architecture.md, section 2b).

Lane p of sample block s holds sample b = s * P + p. A forward step reads one weight W[j, k]
and gives it to every lane; each lane multiplies it by its own sample's activation A[b, k].
So a weight is read once per P samples (v1 read it once per sample), and every lane is busy
whatever the layer's width (v1's lanes held P outputs of one sample: a 10-wide layer left
22 of 32 lanes idle). The memories are laid out for it (P: lanes, S = ceil(B / P) sample
blocks):

- weights: one weight per word; layer l's W[j, k] at ``wbase_l + j * K + k``;
- activations: words of P bytes, lane p of a word belonging to sample s * P + p; layer l's
  input A[b, k] at word ``abase_l + s * K + k``;
- gradients: words of P 16-bit lanes, the same way; the logits Z[b, j] at word ``s * N + j``;
- predictions: one per sample, at b.

A step of a command is a *program*: a list of phases (`Phase`), each a loop nest of LEVELS
levels with three address generators (`GENERATORS`: w, a, o) and a kind that says what the
datapath does at each step (`KINDS`). The host compiles the program (`infer_program`), writes
it to the engine's program memory as words (`encode`), and the engine walks it
(ember_hw.sample_engine). `execute` is the engine's golden twin: it walks the same nests,
with the same actions, on the same memories, and counts the same events.
"""

from dataclasses import dataclass, replace
from math import prod

import numpy as np

from . import spec
from .program import BOUND_BITS, Nest
from .golden import (argmax_first, bit_length, keep_count, lfsr_sequence, requantize,
                     round_shift, saturate, saturate_grad, select_channels, sgd_update,
                     sign_update, softmax_grad)
from .spec import StepSettings

#: The loop levels of engine v2's nests, level 0 outermost (program.Nest and LoopNest take it
#: as `levels`): the weight gradient's has five (kept channel, input group, pass, sample block,
#: input in the group).
LEVELS = 5
INNER = LEVELS - 1
#: The sample block's level in the forward and input-gradient nests (block, output or input,
#: input or kept channel).
BLOCK_LEVEL = LEVELS - 3
#: The weight-gradient nests (kept channel c, input group, pass, sample block, input in the
#: group): the block's level, the pass level and the group size (spec.GRAD_HOLD). PSG walks a
#: group's blocks twice (the prediction, then full precision where it is not confident); the
#: pass level's strides are 0, so the second pass reads what the first did; its bound is 2
#: under PSG and 1 otherwise, set at run time.
GRAD_BLOCK_LEVEL = LEVELS - 2
PASS_LEVEL = LEVELS - 3
#: The address generators of a phase. What each addresses depends on the kind (w: a weight
#: or, for argmax, the class; a: an activation word or, for requant and argmax, the dX scratch
#: entry or logits word; g: a gradient word read; o: the word, entry or sample written).
GENERATORS = ("w", "a", "g", "o")
#: Phase kinds and their codes in the program memory (0 ends the program).
KINDS = {"end": 0, "forward": 1, "logits": 2, "argmax": 3, "loss": 4, "select": 5,
         "input_grad": 6, "requant": 7, "weight_grad": 8, "psg_max": 9}
#: The kinds of a layer's backward pass and whether each runs for the layer: "w" when its
#: weights are updated (the SLU mask), "x" when the input gradient is needed (a layer below is).
BACKWARD_KINDS = {"select": "wx", "input_grad": "x", "requant": "x", "weight_grad": "w",
                  "psg_max": "w"}
#: The level of each kind's nest that walks the sample blocks (each kind's nest, padded at the
#: outer end to LEVELS: forward, logits and input_grad (s, j or k, k or c); select (j, s);
#: weight_grad and psg_max (c, input group, pass, s, input); argmax and requant (s, lane,
#: class or input); loss (s, lane)). A program is compiled for a batch, its *capacity*
#: (its sample blocks' bounds S = ceil(capacity / P)); it runs any batch up to it: the core
#: takes the batch from its register, and the lanes of samples at or past it are dead
#: (`live_lanes`): they read, multiply and write nothing and count no event, so the events
#: of a batch are the same whatever the capacity of the program that ran it. A dead sample
#: block still costs its steps' cycles.
SAMPLE_LEVEL = {"forward": BLOCK_LEVEL, "logits": BLOCK_LEVEL, "input_grad": BLOCK_LEVEL,
                "select": INNER, "weight_grad": GRAD_BLOCK_LEVEL, "psg_max": GRAD_BLOCK_LEVEL,
                "argmax": BLOCK_LEVEL, "requant": BLOCK_LEVEL, "loss": INNER - 1}
#: The kinds whose steps each belong to one sample: the level inside SAMPLE_LEVEL that walks
#: the lanes of a block. A step of a sample at or past the batch is dead: it costs a cycle
#: and does nothing.
LANE_LEVEL = {"argmax": BLOCK_LEVEL + 1, "requant": BLOCK_LEVEL + 1, "loss": INNER}
#: Header fields, (word, offset, width): the kind, the forward shift, the layer, and the
#: layer's inputs K and outputs N (bits 4..11 of word 0 are not used).
HEADER_FIELDS = {"kind": (0, 0, 4), "shift": (0, 12, 6),
                 "layer": (0, 18, 4), "outputs": (1, 0, 16), "inputs": (1, 16, 16)}
HEADER_WORDS = 2
#: Program memory words per phase: the header, the bounds two to a word, and for each
#: generator its base and one delta per level.
BOUND_WORDS = -(-LEVELS // 2)
PHASE_WORDS = HEADER_WORDS + BOUND_WORDS + len(GENERATORS) * (1 + LEVELS)
WORD_MASK = (1 << spec.BUS_DATA_BITS) - 1


@dataclass(frozen=True)
class Phase:
    """One phase of a program: a loop nest (program.Nest: LEVELS levels, the GENERATORS'
    bases and strides) and what each step does.

    kind:    a KINDS name.
    nest:    the loop nest, outermost level first. In the backward kinds the channel level's
             bound is the kept count and the pass level's PSG's passes, set at run time
             (KEPT_LEVEL, PASS_LEVEL).
    shift:   forward, logits: the layer's requantization shift.
    layer:   the layer (backward kinds: which SLU mask bit decides whether it runs).
    inputs, outputs: the layer's K and N.
    """
    kind: str
    nest: Nest
    shift: int = 0
    layer: int = 0
    inputs: int = 0
    outputs: int = 0

    @property
    def bounds(self):
        return self.nest.bounds

    def with_bound(self, level, bound):
        n = self.nest
        bounds = n.bounds[:level] + (bound,) + n.bounds[level + 1:]
        return replace(self, nest=Nest(bounds, n.bases, n.strides))

    def walk(self):
        """The steps in loop order (program.Nest.walk): (indices, addresses, first, last)."""
        for st in self.nest.walk():
            yield st.indices, st.addresses, st.first, st.last


def nest(loops, gens):
    """The nest of `loops` ([(name, bound), ...], outermost first, at most LEVELS) and
    `gens` ({generator: (base, {loop name: stride})}); a generator it does not name has base
    and strides 0."""
    gens = {g: gens.get(g, (0, {})) for g in GENERATORS}
    return Nest.of(loops, gens, levels=LEVELS)


def sample_blocks(build, batch):
    return -(-batch // build.lanes)


def layout(layers, build, batch):
    """Memory bases of a network for a batch: weight bases (words), activation bases
    (words) of each layer's input, and the two halves of the gradient memory (words)."""
    S = sample_blocks(build, batch)
    wbase, abase = [0], [0]
    for k, n in zip(layers[:-1], layers[1:]):
        wbase.append(wbase[-1] + n * k)
        abase.append(abase[-1] + S * k)
    return wbase[:-1], abase[:len(layers) - 1], (0, build.grad_words // 2)


def check_fits(layers, build, batch, train=True):
    """Raise spec.ConfigError, naming the memory, what the network needs of it and what the
    build has, if the network and batch do not fit this dataflow's memories."""
    S, P = sample_blocks(build, batch), build.lanes
    needs = {"weight": (sum(k * n for k, n in zip(layers, layers[1:])),
                        build.weight_words * P, "weights"),
             "activation": (S * sum(layers[:-1]), build.act_bytes // P, "words")}
    if train:
        needs["gradient"] = (2 * S * max(layers[1:]), build.grad_words, "words")
        needs["dX scratch"] = (S * P * max(layers[1:-1], default=0), build.scratch_entries,
                               "entries")
    else:
        needs["gradient"] = (S * layers[-1], build.grad_words, "words")
    if batch > build.max_batch:
        raise spec.ConfigError(f"batch {batch} exceeds the build's {build.max_batch}")
    for memory, (need, have, unit) in needs.items():
        if need > have:
            raise spec.ConfigError(f"{'-'.join(map(str, layers))} at batch {batch} needs "
                                   f"{need} {memory} {unit}; the build has {have}")


def program_words_needed(layers, build, batch=None):
    """The program memory words of the largest program the host compiles for `layers` (a
    train program with relative PSG's phases, on a build with the PSG unit). The same for
    every batch: a program's phases do not depend on it (`batch` is accepted for the
    callers that name one)."""
    shifts = [0] * (len(layers) - 1)
    phases = len(_train_phases(layers, build, 1, shifts,
                               psg_relative="psg_max" in build_kinds(build)))
    return phases * PHASE_WORDS + HEADER_WORDS


def _per_sample(kind, build, batch, loops, gens, lane_step=1, **fields):
    """The phase whose steps walk the samples one by one (loss, argmax) or `lane_step` at a
    time (requant: lane_step(kind, build)): the sample blocks, the P / lane_step steps of
    each (LANE_LEVEL), then `loops`; `gens` strides may use "s" and "p". The steps of lanes
    past the batch are dead (live_lanes)."""
    P, S = build.lanes, sample_blocks(build, batch)
    return [Phase(kind, nest([("s", S), ("p", P // lane_step)] + loops, gens), **fields)]


def lane_step(kind, build):
    """The samples a step of the per-sample kind `kind` takes: Build.drain_lanes (D) for
    requant (the D entries of one scratch bank word, through D shifters) and loss (D loss
    units in lockstep on one logit word, one in each block of P / D lanes: _loss), one for
    argmax."""
    return build.drain_lanes if kind in ("requant", "loss") else 1


def _forward_phases(layers, build, batch, shifts):
    S = sample_blocks(build, batch)
    wbase, abase, (g_top, _) = layout(layers, build, batch)
    phases = []
    for l, (k, n) in enumerate(zip(layers[:-1], layers[1:])):
        last = l == len(layers) - 2
        out = g_top if last else abase[l + 1]
        phases.append(Phase("logits" if last else "forward",
                            nest([("s", S), ("j", n), ("k", k)],
                                  {"w": (wbase[l], {"j": k, "k": 1}),
                                   "a": (abase[l], {"s": k, "k": 1}),
                                   "o": (out, {"s": n, "j": 1})}),
                            shift=shifts[l], layer=l, inputs=k, outputs=n))
    return phases


def infer_program(layers, build, batch, shifts):
    """The phases of an infer command: a forward phase per layer (the last one writing
    logits), then the argmax of each sample's logits into the predictions."""
    check_fits(layers, build, batch, train=False)
    return _infer_phases(layers, build, batch, shifts)


def _infer_phases(layers, build, batch, shifts):
    n = layers[-1]
    return _forward_phases(layers, build, batch, shifts) + _per_sample(
        "argmax", build, batch, [("n", n)],
        {"w": (0, {"n": 1}), "a": (0, {"s": n, "n": 1}), "o": (0, {"s": build.lanes, "p": 1})},
        outputs=n)


def train_program(layers, build, batch, shifts, psg_relative=False):
    """The phases of a train command: forward, the loss of every sample, then each layer's
    backward pass from the top: ssProp's channel selection (the kept list; every channel
    when dense), the input gradient into the dX scratch and its requantization into dY of
    the layer below, and the weight gradient with the update (PSG's relative threshold
    first finds the layer's largest prediction: psg_max). Which backward phases run is
    decided at run time from the SLU mask (BACKWARD_KINDS); the channel level's bound is
    the kept count. Relative PSG needs the PSG unit (the psg_max phase: build_kinds)."""
    check_fits(layers, build, batch)
    if psg_relative and "psg_max" not in build_kinds(build):
        raise spec.ConfigError(f"relative PSG needs the psg unit; build '{build.name}' has "
                               f"{', '.join(build.features) or 'no units'}")
    return _train_phases(layers, build, batch, shifts, psg_relative)


def _train_phases(layers, build, batch, shifts, psg_relative):
    P, S = build.lanes, sample_blocks(build, batch)
    D = build.drain_lanes                       # lane_step of requant and loss
    wbase, abase, halves = layout(layers, build, batch)
    L = len(layers) - 1
    phases = _forward_phases(layers, build, batch, shifts)
    n = layers[-1]
    phases += _per_sample("loss", build, batch, [],
                          {"a": (halves[0], {"s": n}), "o": (0, {"s": P, "p": 1})},
                          lane_step=D, outputs=n, layer=L - 1)
    for l in range(L - 1, -1, -1):
        k, n = layers[l], layers[l + 1]
        g_cur, g_below = halves[(L - 1 - l) % 2], halves[(L - l) % 2]
        fields = dict(layer=l, inputs=k, outputs=n)
        phases.append(Phase("select", nest([("j", n), ("s", S)],
                                            {"g": (g_cur, {"j": 1, "s": n})}),
                            **fields))
        if l > 0:
            phases.append(Phase("input_grad",
                                nest([("s", S), ("k", k), ("c", n)],
                                      {"w": (wbase[l], {"k": 1}),
                                       "a": (abase[l], {"s": k, "k": 1}),
                                       "g": (g_cur, {"s": n}),
                                       "o": (0, {"s": k * P, "k": P})}),
                                **fields))
            phases += _per_sample("requant", build, batch, [("k", k)],
                                  {"a": (0, {"s": k * P, "p": D, "k": P}),
                                   "o": (g_below, {"s": k, "k": 1})},
                                  lane_step=D, **fields)
        # the weight gradient in groups of GRAD_HOLD inputs (and one of the remainder)
        R = spec.GRAD_HOLD
        groups, rem = divmod(k, R)
        parts = ([(0, groups, R)] if groups else []) + ([(groups * R, 1, rem)] if rem else [])
        grad = [nest([("c", n), ("kb", kb), ("pass", 2), ("s", S), ("kn", kn)],
                     {"w": (wbase[l] + k0, {"kb": R, "kn": 1}),
                      "a": (abase[l] + k0, {"s": k, "kb": R, "kn": 1}),
                      "g": (g_cur, {"s": n}),
                      "o": (0, {"kn": 1})}) for k0, kb, kn in parts]
        if psg_relative:
            phases += [Phase("psg_max", g, **fields) for g in grad]
        phases += [Phase("weight_grad", g, **fields) for g in grad]
    return phases


#: The level whose bound is the kept count, per backward kind (the channel c).
KEPT_LEVEL = {"input_grad": INNER, "weight_grad": LEVELS - 5, "psg_max": LEVELS - 5}


def max_bound(build):
    """The largest bound of a level in any program the host compiles for `build`: a width (the
    outputs, inputs or channels of a layer), the sample blocks of the largest batch, the
    lanes of a block, or a weight-gradient group's GRAD_HOLD inputs and 2 passes."""
    return max(build.max_width, sample_blocks(build, build.max_batch), build.lanes,
               spec.GRAD_HOLD, 2)


def bound_bits(build):
    """The width of the core's bound registers and its loop nest's counters on `build`: what
    max_bound needs. The program's words carry program.BOUND_BITS; a written bound that does
    not fit these is refused (bound_limit)."""
    return max_bound(build).bit_length()


def bound_limit(build):
    """The largest bound the core runs on `build`: a phase with a larger written bound (at a
    level the core does not bound at run time) stops with a fault, and `verify` refuses it."""
    return (1 << bound_bits(build)) - 1


def book_multiplier_bits(build):
    """The width of the multiplier operand b of the select phase's bookkeeping (the core's
    serial multiplier takes this many steps a product): the keep ratio, the batch or a width."""
    return max(build.max_width, build.max_batch, spec.KEEP_ONE).bit_length()


#: Cycles of every phase besides its steps and the drain of its pipeline: loading its
#: PHASE_WORDS words (PHASE_WORDS + 1), the nest's start (2: step 0 is presented two cycles
#: after it), the nest's done cycle and the runner's NEXT.
PHASE_OVERHEAD = PHASE_WORDS + 1 + 2 + 1 + 1
#: A phase the SLU mask leaves out, and the end phase: its header words, then NEXT (FINISH).
HEADER_ONLY_CYCLES = HEADER_WORDS + 2
#: Builds with at least this many lanes get the fanout registers below (WIDE): their lanes
#: spread across the chip (32 on the ECP5), and one control signal or weight read reaching
#: all of them in the cycle it is formed was the critical path. A narrower build (the
#: iCEBreaker's 2 lanes) has none (NARROW): its fanout is a few loads, and on the UP5K every
#: such register bit is a logic cell of its own (docs/boards.md, session 25).
FANOUT_LANES = 8


@dataclass(frozen=True)
class Pipeline:
    """The registers engine v2 (ember_hw.sample_engine) puts on its fanouts, by build
    (`pipeline`). They change cycles, never results or events.

    gate:         registers between the lanes' zero gates (formed from the activation
                  memory's read data) and the weight memory's read enable ("read W[j, k]
                  unless every lane is gated") in the forward and input-gradient phases; the
                  input gradient's kept-channel addresses are registered with them. On the
                  32-lane ECP5 build the OR of every lane's gate into the enable, in the read
                  data's own cycle, was the critical path (docs/boards.md, session 12).
    broadcast:    registers between the weight memory's read data and the lanes' operands in
                  the same phases: the one weight read per step goes to all P lanes.
    memory_write: registers in front of the activation and gradient memories' writes
                  (ember_hw.lanemem, write_stages): each write goes to all P lanes' block
                  RAMs (docs/boards.md, session 14). No phase reads a word it wrote this
                  soon, and a phase's next reads come after the next phase's PHASE_WORDS
                  words are loaded, so no cycle count changes.
    grad_tree:    registered levels of the weight gradient's adder tree across the P lanes
                  (ember_hw.arith.pipelined_tree_sum): 32 products into one sum in one cycle
                  do not route at 30 MHz on the ULX3S build; with 0 the lanes' products are
                  summed into the accumulator in the cycle they arrive.
    round_output: registers after the rounding shifters' outputs, before the saturation, in
                  the forward writeback (ember_hw.writeback) and the dX requantizer
                  (ember_hw.requant): 0 or 1. With 0 a shifter's result is saturated and
                  written in the cycle it comes out, so the writeback unit's blocks
                  (writeback_gap) and the requant phase's drain are a cycle shorter; on the
                  UP5K each bit of the two 33-bit registers took a logic cell of its own
                  (docs/boards.md, session 25).
    """
    gate: int
    broadcast: int
    memory_write: int
    grad_tree: int
    round_output: int

    @property
    def snap_latency(self):
        """Cycles from a forward or input-gradient step to the snapshot of its sums: the
        activation read, the gates, the weight (and dY) read, the broadcast, the operand and
        product registers, the accumulator."""
        return 5 + self.gate + self.broadcast

    @property
    def grad_sum_latency(self):
        """Cycles from a weight-gradient step to its input's accumulator over the blocks: the
        activation read, the dY read, the operand and product registers, then the tree."""
        return 4 + self.grad_tree

    @property
    def writeback_gap(self):
        """The forward writeback unit (ember_hw.writeback) takes a block's sums every P / D +
        this many cycles (D = Build.drain_lanes; busy P / D + writeback_gap - 1 cycles after
        each hand-over): the hand-over's cycle and the unit's first, the P / D takes, then
        the shifters' two stages and the round_output registers, the last of which writes.
        So a group's last step waits that long after the last group's (whatever the
        pipeline's latency: both snapshots are as late)."""
        return 4 + self.round_output

    @property
    def requant_latency(self):
        """Cycles from a requant step to its write of dY: the scratch read, the shifters'
        two stages and the round_output registers, the last of which writes."""
        return 3 + self.round_output


WIDE = Pipeline(gate=1, broadcast=1, memory_write=1, grad_tree=2, round_output=1)
NARROW = Pipeline(gate=0, broadcast=0, memory_write=0, grad_tree=0, round_output=0)


def pipeline(build):
    """`build`'s fanout registers: WIDE from FANOUT_LANES lanes, else NARROW."""
    return WIDE if build.lanes >= FANOUT_LANES else NARROW


#: Registered levels of the select phase's sum of the live lanes' |dY| (ssProp's scores).
SCORE_TREE_STAGES = 2
#: Cycles from the weight gradient's sum of a (j, k) to the update unit's write of W[j, k]
#: (ember_hw.sample_engine._update: the new weight, its register, the write).
UPDATE_WRITE_LATENCY = 3
#: Cycles from the update's read of W[j, k] to its write: a group's spec.GRAD_HOLD updates
#: come one a cycle, so on a single-port weight memory (an SB_SPRAM256KA, Build.weight_spram)
#: their reads and writes then fall in separate cycles.
UPDATE_WRITE_DISTANCE = spec.GRAD_HOLD
#: The update reads W[j, k] this many cycles before the sum of its gradient is done.
UPDATE_READ_LEAD = UPDATE_WRITE_DISTANCE - UPDATE_WRITE_LATENCY
#: Cycles from a phase's last step to the end of its drain, per kind, for P / D groups of D =
#: Build.drain_lanes lanes and the build's Pipeline: the pipeline's stages, and the forward
#: writeback's P / D + writeback_gap - 1 busy cycles after the snapshot, the dX drain's P / D
#: cycles, the requant phase's requant_latency, the update's three stages after the weight
#: gradient's sum.
_DRAIN = {"forward": lambda G, p: p.snap_latency + G + p.writeback_gap,
          "logits": lambda G, p: p.snap_latency + G + p.writeback_gap,
          "argmax": lambda G, p: 3, "loss": lambda G, p: 3,
          "select": lambda G, p: 3 + SCORE_TREE_STAGES,
          "input_grad": lambda G, p: p.snap_latency + G + 2,
          "requant": lambda G, p: p.requant_latency + 1,
          "weight_grad": lambda G, p: p.grad_sum_latency + UPDATE_WRITE_LATENCY + 1,
          "psg_max": lambda G, p: p.grad_sum_latency + 1}


def _selector_cycles(build, batch, n, settings):
    """ssProp's selector (ember_hw.select.ChannelSelector) on n channels, at its longest: one
    pass of n + 1 cycles per searched bit of the largest score, then the fill pass; k >= n:
    n + 2 cycles. Top-k scores sum |dY| < 2**15 over the batch, random ones are LFSR states."""
    if "ssprop" not in build.features:
        return 0
    if settings is not None and settings.keep_q8 >= spec.KEEP_ONE:
        return n + 2
    scores = []
    if settings is None or not settings.ssprop_random:
        scores.append(batch << (spec.GRAD_BITS - 1))
    if "ssprop_random" in build.features and (settings is None or settings.ssprop_random):
        scores.append((1 << 16) - 1)
    passes = min(32, 1 + max(scores).bit_length())
    return (passes + 1) * (n + 1) + 1


def book_products(build):
    """The serial products of the select phase's bookkeeping (ember_hw.sample_engine's BOOK
    states): batch * K and that times N (the work SLU skips), and on a build with the ssProp
    unit the keep count and the work ssProp drops as well."""
    return 4 if "ssprop" in build.features else 2


def _book_cycles(build):
    """The select phase's bookkeeping before its words are loaded again: 3 states and
    book_products(build) serial products of book_multiplier_bits(build) steps, each started
    and taken (+ 2)."""
    return 3 + book_products(build) * (book_multiplier_bits(build) + 2)


def _update_stalls(bounds, build, passes):
    """The cycles a weight-gradient phase with these (effective) bounds waits so that no
    update reads the single-port weight memory in the cycle an earlier one writes it
    (ember_hw.sample_engine._update_stall), on a weight_spram build (none on another). A
    step that ends in an update (the last sample block's, in the last pass) waits while the
    update issued UPDATE_WRITE_DISTANCE cycles before it would write.

    None wait when each input group is spec.GRAD_HOLD wide and has two sample blocks or
    more: a group's updates come GRAD_HOLD in a row, then at least GRAD_HOLD steps without
    one (the next group's other blocks). With one pass (no PSG) nothing else holds the
    steps, so the waits are counted here exactly, walking the steps of each (channel, input
    group) with the issued updates of the last UPDATE_WRITE_DISTANCE cycles. Under PSG
    (the second pass waits for decisions, which depend on the data): each cycle waited is
    owed to the update issued UPDATE_WRITE_DISTANCE cycles before, which is not the last,
    so the updates less one bound them."""
    if not build.weight_spram:
        return 0
    inner, blocks = bounds[INNER], bounds[GRAD_BLOCK_LEVEL]
    if inner == spec.GRAD_HOLD and blocks >= 2:
        return 0
    units = int(np.prod(bounds)) // (inner * blocks * bounds[PASS_LEVEL])
    if passes != 1:
        return max(units * inner - 1, 0)
    steps = [False] * (inner * (blocks - 1)) + [True] * inner
    distance = UPDATE_WRITE_DISTANCE
    walked = {}                         # the recent updates at a unit's start -> its waits
    recent, total = (False,) * distance, 0
    for _ in range(units):
        if recent not in walked:
            history, waits = recent, 0
            for update in steps:
                while update and history[-1]:
                    history, waits = (False,) + history[:-1], waits + 1
                history = (update,) + history[:-1]
            walked[recent] = waits, history
        waits, recent = walked[recent]
        total += waits
    return total


def phase_cycle_bound(ph, build, batch, settings=None, runs=True):
    """An upper bound on the busy cycles the v2 core (ember_hw.sample_engine) spends on the
    phase `ph` of a command at batch `batch` (at most the program's capacity; a dead sample
    block costs its steps as a live one): PHASE_OVERHEAD, its steps and what holds them,
    and its drain (_DRAIN). settings None: for every step setting and any data (the kept
    count at the layer's outputs, two PSG passes, the selector at its longest); a
    StepSettings: for that step (its kept count and passes). `runs` false: a backward phase
    the SLU mask leaves out, which costs its header (and the select phase its bookkeeping).
    Zero skipping saves reads, not cycles.

    Per kind, P lanes, n_i the nest's effective bounds, steps their product, and G the steps
    over the innermost bound n_inner (the groups that end in a snapshot or a drain):
      forward, logits: a group's last step waits for the writeback unit, busy P / D +
                       writeback_gap - 1 cycles after each snapshot (D = Build.drain_lanes
                       lanes a cycle; Pipeline.writeback_gap):
                       n_inner + (G - 1) * max(n_inner, P / D + writeback_gap);
      input_grad:      the same with the dX drain's P / D cycles: max(n_inner, P / D + 1);
      loss:            a step per D samples (D loss units in lockstep, one sample in each
                       lane block of P / D lanes), each the softmax-gradient unit's 3N + 23
                       cycles (ember_hw.loss) and 3 + D of the runner's (D for the labels);
                       a dead step's (its first sample, s * P + p, past the batch) two;
      select:          its steps, the selector (_selector_cycles), the kept list (N + 2),
                       and before them its header and bookkeeping (_book_cycles);
      weight_grad:     its steps; under PSG the second pass of each (channel, input group)
                       waits up to grad_sum_latency + 1 cycles for the first pass's
                       decisions; on a weight_spram build, _update_stalls;
      argmax, requant, psg_max: their steps.
    """
    P = build.lanes
    groups_drained = P // build.drain_lanes
    pipe = pipeline(build)
    kind = ph.kind
    passes, kept = 2, ph.outputs
    if settings is not None:
        passes = 2 if settings.psg else 1
        if "ssprop" in build.features:
            kept = keep_count(ph.outputs, settings.keep_q8)
        if not runs:
            return HEADER_ONLY_CYCLES + (_book_cycles(build) if kind == "select" else 0)
    bounds = list(ph.bounds)
    if kind in KEPT_LEVEL:
        bounds[KEPT_LEVEL[kind]] = kept
    if kind in ("weight_grad", "psg_max"):
        bounds[PASS_LEVEL] = passes if kind == "weight_grad" else 1
    steps = int(np.prod(bounds))
    inner = bounds[INNER]
    groups = steps // inner if inner else 0
    if kind in ("forward", "logits"):
        run = inner + (groups - 1) * max(inner, groups_drained + pipe.writeback_gap)
    elif kind == "input_grad":
        run = inner + (groups - 1) * max(inner, groups_drained + 1)
    elif kind == "loss":
        # a step's first sample is s * P + p (the host's o): live steps below the batch
        blocks, S = bounds[SAMPLE_LEVEL[kind]], bounds[LANE_LEVEL[kind]]
        walked = blocks * S
        live = sum(min(S, max(0, batch - b * P)) for b in range(blocks))
        D = lane_step(kind, build)
        run = (steps // walked) * (live * (3 * ph.outputs + 23 + 3 + D) + 2 * (walked - live))
    elif kind == "weight_grad":
        wait = pipe.grad_sum_latency + 1
        run = steps + (wait * bounds[0] * bounds[1] if passes == 2 else 0)
        run += _update_stalls(bounds, build, bounds[PASS_LEVEL])
    else:
        run = steps
    if kind == "select":
        run += (HEADER_ONLY_CYCLES + _book_cycles(build)
                + _selector_cycles(build, batch, ph.outputs, settings) + ph.outputs + 2)
    return PHASE_OVERHEAD + run + _DRAIN[kind](groups_drained, pipe)


def program_cycle_bound(phases, build, batch, settings=None):
    """An upper bound on the busy cycles of a command that runs the program `phases` at
    batch `batch` on the v2 core: the sum of phase_cycle_bound, the end phase's header and
    the runner's last state. settings None: for every step setting and any data; a
    StepSettings: for that step's (its SLU mask decides which backward phases run). What
    the watchdog's limit is set to (spec.command_cycle_bound on a samples build)."""
    n_layers = 1 + max((ph.layer for ph in phases), default=0)
    total = HEADER_ONLY_CYCLES + 1
    for ph in phases:
        runs = True
        if settings is not None and ph.kind in BACKWARD_KINDS:
            runs = _Run.runs_for(settings.mask(n_layers), ph)
        total += phase_cycle_bound(ph, build, batch, settings, runs)
    return total


def command_cycle_bound(build, layers, batch, train=True, settings=None, capacity=None):
    """spec.command_cycle_bound on a samples build: the program_cycle_bound at `batch` of the
    program the host compiles for the network and `capacity` (the batch by default; a train
    program with psg_max phases unless `settings` leave relative PSG off), whether or not it
    fits the build's memories."""
    shifts = [0] * (len(layers) - 1)
    compiled = batch if capacity is None else capacity
    if not train:
        return program_cycle_bound(_infer_phases(layers, build, compiled, shifts), build,
                                   batch)
    relative = settings is None or (settings.psg and settings.psg_relative)
    return program_cycle_bound(_train_phases(layers, build, compiled, shifts, relative),
                               build, batch, settings)


def encode(phases, build):
    """The program memory's words of `phases`, ended by an "end" header."""
    words = []
    for ph in phases:
        head = [0] * HEADER_WORDS
        for name, (w, off, width) in HEADER_FIELDS.items():
            value = KINDS[ph.kind] if name == "kind" else getattr(ph, name)
            if not 0 <= value < 1 << width:
                raise spec.ConfigError(f"phase field {name} {value} is outside 0.."
                                       f"{(1 << width) - 1}")
            head[w] |= value << off
        words += head
        for i in range(0, LEVELS, 2):
            words.append(ph.bounds[i] | (ph.bounds[i + 1] << BOUND_BITS if i + 1 < LEVELS else 0))
        deltas = ph.nest.deltas()
        for g in GENERATORS:
            words.append(ph.nest.bases[g] & WORD_MASK)
            words.extend(d & WORD_MASK for d in deltas[g])
    words += [KINDS["end"]] * HEADER_WORDS
    if len(words) > build.program_words:
        raise spec.ConfigError(f"the program has {len(words)} words; the engine holds "
                               f"{build.program_words} (build '{build.name}')")
    return words


def _signed(word):
    return word - (1 << spec.BUS_DATA_BITS) if word >> (spec.BUS_DATA_BITS - 1) else word


def decode(words):
    """The phases of program memory words (encode's inverse, up to the "end" header): each
    generator's strides recovered from its deltas, innermost level first (stride_i = delta_i +
    sum over j > i of (n_j - 1) * stride_j). Raises spec.ConfigError for an unknown kind or
    words that end inside a phase."""
    phases, at = [], 0
    while True:
        if at + HEADER_WORDS > len(words):
            raise spec.ConfigError(f"the program ends at word {len(words)} without an end phase")
        fields = _header(words, at)
        code = fields.pop("kind")
        kind = KIND_NAMES.get(code)
        if kind is None:
            raise spec.ConfigError(f"word {at}: phase kind {code} is not one of "
                                   f"{sorted(KINDS.values())}")
        if kind == "end":
            return phases
        if at + PHASE_WORDS > len(words):
            raise spec.ConfigError(f"the program ends at word {len(words)} inside the phase "
                                   f"at word {at}")
        phases.append(_phase(words, at, kind, fields))
        at += PHASE_WORDS


#: Phase kinds by their code in the program memory.
KIND_NAMES = {code: name for name, code in KINDS.items()}


def build_kinds(build):
    """The phase kinds (name -> code, KINDS' order) that `build`'s core runs: psg_max only
    with the PSG unit. The core faults at any other kind as at an unknown one, and verify
    refuses it, so a build without PSG keeps no logic for the predictor's operands."""
    return {name: code for name, code in KINDS.items()
            if name != "psg_max" or "psg" in build.features}


def _header(words, at):
    """The header fields of the phase at word `at` (the kind as its code)."""
    head = words[at:at + HEADER_WORDS]
    return {name: (head[w] >> off) & ((1 << width) - 1)
            for name, (w, off, width) in HEADER_FIELDS.items()}


def _phase(words, at, kind, fields):
    """The Phase at word `at`, its header's `fields` read (_header, the kind popped)."""
    body = words[at + HEADER_WORDS:at + PHASE_WORDS]
    mask = (1 << BOUND_BITS) - 1
    bounds = tuple((body[i // 2] >> (BOUND_BITS * (i % 2))) & mask for i in range(LEVELS))
    bases, strides = {}, {}
    for g_i, g in enumerate(GENERATORS):
        at_g = BOUND_WORDS + g_i * (1 + LEVELS)
        bases[g] = body[at_g]
        deltas = [_signed(d) for d in body[at_g + 1:at_g + 1 + LEVELS]]
        st = [0] * LEVELS
        for i in range(LEVELS - 1, -1, -1):
            st[i] = deltas[i] + sum((bounds[j] - 1) * st[j] for j in range(i + 1, LEVELS))
        strides[g] = tuple(st)
    return Phase(kind, Nest(bounds, bases, strides), **fields)


# ---------------------------------------------------------------- the static program check
#: What each generator's address is compared with in a phase of each kind (GENERATORS): the
#: memory it addresses, or the range of what it counts. The core compares every generator at
#: every step, the ones a kind does not use too (their bases and deltas are 0).
ADDRESSED = {
    "forward": {"w": "weights", "a": "activation words", "g": "gradient words",
                "o": "activation words"},
    "logits": {"w": "weights", "a": "activation words", "g": "gradient words",
               "o": "gradient words"},
    "argmax": {"w": "classes", "a": "gradient words", "g": "gradient words", "o": "samples"},
    "loss": {"w": "weights", "a": "gradient words", "g": "gradient words", "o": "samples"},
    "select": {"w": "weights", "a": "activation words", "g": "gradient words",
               "o": "activation words"},
    "input_grad": {"w": "weights", "a": "activation words", "g": "gradient words",
                   "o": "dX scratch entries"},
    "requant": {"w": "weights", "a": "dX scratch entries", "g": "gradient words",
                "o": "gradient words"},
    "weight_grad": {"w": "weights", "a": "activation words", "g": "gradient words",
                    "o": "group inputs"},
    "psg_max": {"w": "weights", "a": "activation words", "g": "gradient words",
                "o": "group inputs"},
}


def memory_sizes(build):
    """The entries of each memory (and range) of ADDRESSED on `build`."""
    P = build.lanes
    return {"weights": build.weight_words * P, "activation words": build.act_bytes // P,
            "gradient words": build.grad_words, "dX scratch entries": build.scratch_entries,
            "classes": build.max_width, "samples": build.max_batch,
            "group inputs": spec.GRAD_HOLD}


def limits(kind, build):
    """dict generator -> its limit in a phase of `kind` on `build`: the core stops a step
    whose address is not below it. The one table of these limits (ember_hw.sample_engine
    gives them to its loop nest; `verify` checks a program against them)."""
    sizes = memory_sizes(build)
    return {g: sizes[memory] for g, memory in ADDRESSED[kind].items()}


def run_time_bounds(ph, select):
    """dict level -> the largest bound the core gives that level of `ph` at run time (its
    written bound is not used): the kept channel level's is the kept count, at most the
    outputs of the select phase that made the kept list (`select`), and the pass level's
    PSG's passes (2 in a weight gradient under PSG, else 1)."""
    out = {}
    if ph.kind in KEPT_LEVEL:
        out[KEPT_LEVEL[ph.kind]] = select.outputs
    if ph.kind in ("weight_grad", "psg_max"):
        out[PASS_LEVEL] = 2 if ph.kind == "weight_grad" else 1
    return out


def effective_nest(ph, select):
    """`ph`'s nest with its run-time levels at their largest bounds (run_time_bounds)."""
    bounds = list(ph.bounds)
    for level, bound in run_time_bounds(ph, select).items():
        bounds[level] = bound
    return Nest(tuple(bounds), ph.nest.bases, ph.nest.strides)


def _header_fault(ph, build, select):
    if ph.shift > spec.FORWARD_SHIFT_MAX:
        return f"shift {ph.shift} is above {spec.FORWARD_SHIFT_MAX}, the largest forward shift"
    if ph.layer >= build.max_layers:
        return f"layer {ph.layer} is outside 0..{build.max_layers - 1} (the build's layers)"
    for name in ("inputs", "outputs"):
        if getattr(ph, name) > build.max_width:
            return (f"{name} {getattr(ph, name)} is above {build.max_width}, the build's "
                    "widest layer")
    if ph.kind in ("loss", "select") and ph.outputs < 1:
        return f"outputs 0: a {ph.kind} phase needs at least one (classes or channels)"
    return None


def _kept_list_fault(ph, build, select):
    # the kept list is the last select phase's; a kept phase of another layer could run when
    # that select phase did not (the SLU mask) and use a stale list
    if ph.kind not in KEPT_LEVEL:
        return None
    if select is None:
        return "no select phase before it makes its kept list"
    mine = (ph.layer, ph.inputs, ph.outputs)
    theirs = (select.layer, select.inputs, select.outputs)
    if mine != theirs:
        return (f"its layer, inputs and outputs {mine} are not those of the select phase "
                f"that made its kept list {theirs}")
    return None


def _bound_fault(ph, build, select):
    run_time = run_time_bounds(ph, select)
    top = bound_limit(build)
    for level, bound in enumerate(ph.bounds):
        if level not in run_time and bound < 1:
            return f"level {level}'s bound is {bound}; a bound counts iterations, 1 or more"
        if level not in run_time and bound > top:
            return (f"level {level}'s bound is {bound}, above {top}, the most the build's "
                    f"loop nest counts ({bound_bits(build)} bits)")
    return None


def _run_time_stride_fault(ph, build, select):
    # the core walks a phase by its deltas with the run-time bounds, the executor by the
    # strides of the written ones: the same addresses, whatever the run-time bounds, when a
    # run-time level inside the outermost steps no generator
    for level in run_time_bounds(ph, select):
        for g in GENERATORS:
            stride = ph.nest.strides[g][level]
            if level > 0 and stride != 0:
                return (f"generator {g} steps {stride} at level {level}, whose bound the core "
                        "sets at run time; it must step 0 there")
    return None


def _channel_fault(ph, build, select):
    # the select phase scores one channel per walk of its sample blocks (the innermost level)
    if ph.kind != "select":
        return None
    channels = prod(ph.bounds[:INNER])
    if channels > ph.outputs:
        return f"it scores {channels} channels; the layer has {ph.outputs} outputs"
    return None


def _range_fault(ph, build, select):
    nest, sizes = effective_nest(ph, select), memory_sizes(build)
    for g in GENERATORS:
        lo, hi = nest.span(g)
        memory = ADDRESSED[ph.kind][g]
        if lo < 0:
            return f"generator {g} reaches {lo}; addresses start at 0"
        if hi >= sizes[memory]:
            return (f"generator {g} reaches {hi}; the build has {sizes[memory]} {memory} "
                    f"(0..{sizes[memory] - 1})")
    return None


def derived_reach(ph, build, select):
    """The addresses the core forms from a phase's generators besides theirs, each as (what,
    how it is formed, its largest value, the memory): the kept channel j and j * K added to g
    and w, the dX drain's entry o + lane, the loss unit's word a + n for n < N."""
    nest = effective_nest(ph, select)
    top = {g: nest.span(g)[1] for g in GENERATORS}
    if ph.kind in KEPT_LEVEL:
        j, K = select.outputs - 1, select.inputs
        out = [("the kept channels' weights", f"{top['w']} + {j} * {K}", top["w"] + j * K,
                "weights"),
               ("the kept channels' dY words", f"{top['g']} + {j}", top["g"] + j,
                "gradient words")]
        if ph.kind == "input_grad":
            lanes = build.lanes - 1
            out.append(("the dX drain's entries", f"{top['o']} + {lanes}", top["o"] + lanes,
                        "dX scratch entries"))
        return out
    if ph.kind == "loss":
        n = ph.outputs - 1
        return [("the loss unit's writes", f"{top['a']} + {n}", top["a"] + n, "gradient words")]
    return []


def _derived_fault(ph, build, select):
    sizes = memory_sizes(build)
    for what, formed, reach, memory in derived_reach(ph, build, select):
        if reach >= sizes[memory]:
            return f"{what} reach {formed} = {reach}; the build has {sizes[memory]} {memory}"
    return None


#: verify's checks of one phase, in order: each gives a reason to refuse it, or None.
_PHASE_CHECKS = (_header_fault, _kept_list_fault, _bound_fault, _run_time_stride_fault,
                 _channel_fault, _range_fault, _derived_fault)


#: The checks of `verify_verdict`, in the order it makes them: "end" (no end phase inside
#: the build's program_words, or a phase's words pass them), "kind" (a kind KINDS does not
#: name), then one per _PHASE_CHECKS entry. The 32-bit-word check (_word_fault) is not one of them: it
#: is the host's alone (the program memory holds 32-bit words).
VERIFY_CHECKS = ("end", "kind") + tuple(check.__name__[1:-len("_fault")]
                                        for check in _PHASE_CHECKS)


def verify(words, build, base=0):
    """Check the program memory's `words` (as `encode` writes them) before a run: None if the
    core (ember_hw.sample_engine) can run it on `build` without a fault for any step settings
    and any data, else (phase index, reason), the reason naming the field, its value and its
    limit. The golden twin of the check the shell's program checker makes before a command
    starts (docs/architecture.md, section 2b; verify_verdict also names the check).

    The core's run-time checks, made here for every value the run may give the levels it
    bounds at run time (run_time_bounds): a kind it knows, bounds of 1 to bound_limit, each
    generator's whole range over the nest inside its limit (`limits`), the addresses formed
    from them (derived_reach), and an "end" phase inside the build's program_words. Where the core's
    check is finer than a static bound, this one refuses more: the header's fields in their
    registers' ranges, a kept phase with its select phase's layer and shape, a run-time level
    that steps no generator (unless outermost), a select phase over at most its N channels,
    the dX drain over all P lanes and the kept channels up to N - 1 at every step."""
    verdict = verify_verdict(words, build, base)
    if verdict is None:
        return None
    index, _, reason = verdict
    return index, reason


def verify_verdict(words, build, base=0):
    """`verify`'s verdict with the check that refused: None, or (phase index, the check's
    name in VERIFY_CHECKS, reason), for the program that begins at word `base` (phases
    counted from it). The golden twin of ember_hw.program_check.ProgramCheck, which names
    the same phase and check (its `phase` and `check` ports). A word that is not a 32-bit
    word is refused as check "word", which is not in VERIFY_CHECKS: the program memory
    cannot hold one, so only the host sees it."""
    at, index, select = base, 0, None
    end = min(len(words), build.program_words)
    while True:
        if at + HEADER_WORDS > end:
            return index, "end", (f"phase {index}: no end phase at word {at}; the program has "
                                  f"{len(words)} words, the engine holds {build.program_words}")
        reason = _word_fault(words, at, HEADER_WORDS)
        if reason:
            return index, "word", f"phase {index}: {reason}"
        fields = _header(words, at)
        code = fields.pop("kind")
        kind = KIND_NAMES.get(code)
        if kind not in build_kinds(build):
            return index, "kind", (f"phase {index}: kind {code} is not one of "
                                   f"{sorted(build_kinds(build).values())}, the kinds build "
                                   f"'{build.name}' runs")
        if kind == "end":
            return None
        if at + PHASE_WORDS > end:
            return index, "end", (f"phase {index} ({kind}): its words "
                                  f"{at}..{at + PHASE_WORDS - 1} pass the program's end "
                                  f"({end} words)")
        reason = _word_fault(words, at, PHASE_WORDS)
        if reason:
            return index, "word", f"phase {index} ({kind}): {reason}"
        ph = _phase(words, at, kind, fields)
        for name, check in zip(VERIFY_CHECKS[2:], _PHASE_CHECKS):
            reason = check(ph, build, select)
            if reason:
                return index, name, f"phase {index} ({kind}): {reason}"
        if kind == "select":
            select = ph
        at += PHASE_WORDS
        index += 1


def _word_fault(words, at, count):
    for i in range(at, at + count):
        if not (isinstance(words[i], (int, np.integer)) and 0 <= words[i] <= WORD_MASK):
            return f"word {i} is {words[i]!r}, not a {spec.BUS_DATA_BITS}-bit word"
    return None


class Memories:
    """The v2 engine's memories as arrays (sample-banked, module docstring), and the state a
    command carries from phase to phase (the kept channels, the dX scale, ...)."""

    def __init__(self, build):
        P = build.lanes
        self.P, self.build = P, build
        self.weights = np.zeros(build.weight_words * P, dtype=np.int64)
        self.acts = np.zeros((build.act_bytes // P, P), dtype=np.int64)
        self.grads = np.zeros((build.grad_words, P), dtype=np.int64)
        self.scratch = np.zeros(build.scratch_entries, dtype=np.int64)
        self.labels = np.zeros(build.max_batch, dtype=np.int64)
        self.preds = np.zeros(build.max_batch, dtype=np.int64)

    def load_network(self, layers, weights, batch):
        wbase, _, _ = layout(layers, self.build, batch)
        for base, w in zip(wbase, weights):
            self.weights[base:base + w.size] = np.asarray(w, dtype=np.int64).ravel()

    def read_weights(self, layers, batch):
        wbase, _, _ = layout(layers, self.build, batch)
        return [self.weights[b:b + n * k].reshape(n, k).astype(np.int16)
                for b, k, n in zip(wbase, layers[:-1], layers[1:])]

    def load_inputs(self, x, y=None):
        """The input batch (B, K) into layer 0's activation words; the labels."""
        B, K = x.shape
        for b in range(B):
            s, p = divmod(b, self.P)
            self.acts[s * K:(s + 1) * K, p] = x[b]
        if y is not None:
            self.labels[:B] = y


class _Run:
    """One command's walk over its phases: the executor's state between phases."""

    def __init__(self, mem, settings, n_layers, counts):
        self.mem, self.st, self.c = mem, settings, counts
        self.mask = settings.mask(n_layers)
        self.lfsr = settings.lfsr_seed
        self.correction = 0
        self.correct = 0
        self.kept = None                # the kept channels of the current layer, ascending
        self.dx_max = 0
        self.dx_shift = 0
        self.psg_tau = settings.psg_tau
        self.largest = 0                # psg_max: the layer's largest |prediction| so far
        self.pending = 0                # the correction of the layer above, not yet applied

    def runs(self, ph):
        """Whether a backward phase runs for its layer (the SLU mask)."""
        return self.runs_for(self.mask, ph)

    @staticmethod
    def runs_for(mask, ph):
        """Whether the backward phase `ph` runs under the SLU mask `mask` (one bool per layer):
        "w" kinds when its layer is updated, "x" kinds when a layer below is."""
        l = ph.layer
        need = BACKWARD_KINDS[ph.kind]
        wgrad = mask[l]
        igrad = l > 0 and any(mask[:l])
        return ("w" in need and wgrad) or ("x" in need and igrad)

    def layer_skips(self, ph):
        """skip_slu and skip_ssprop of a layer, counted once at its select phase."""
        c, l = self.c, ph.layer
        n, k = ph.outputs, ph.inputs
        batch = self.batch
        wgrad, igrad = self.mask[l], l > 0 and any(self.mask[:l])
        full = batch * n * k
        c["skip_slu"] += full * (not wgrad) + full * (l > 0 and not igrad)
        if wgrad or igrad:
            keep = keep_count(n, self.st.keep_q8)
            c["skip_ssprop"] += batch * (n - keep) * k * (int(wgrad) + int(igrad))


def train_step(build, layers, weights, shifts, x, y, settings, capacity=None):
    """One training step as the v2 core runs it, from fresh memories: its program (compiled
    for `capacity`, by default the batch), the memories after it, the events and the samples
    classified right."""
    mem = Memories(build)
    mem.load_network(layers, weights, len(x))
    mem.load_inputs(x, y)
    phases = train_program(layers, build, capacity or len(x), shifts,
                           psg_relative=settings.psg and settings.psg_relative)
    counts, correct = execute(phases, mem, len(x), settings=settings)
    return phases, mem, counts, correct


def block_lanes(ph, indices, batch, P):
    """The live lanes of a step of a sample-block kind (forward, logits, select, input_grad,
    weight_grad, psg_max): lane p of the step's sample block s (its index at SAMPLE_LEVEL) is
    live when s * P + p < batch. A bool array of P."""
    return np.arange(P) < batch - indices[SAMPLE_LEVEL[ph.kind]] * P


def step_samples(ph, indices, batch, build):
    """The live samples of a step of argmax or requant (the loss phase's are its samples
    below the batch: _loss), of the lane_step it takes: how many of the (s * n + p) * step-th
    sample and the step - 1 after it (s, p: its indices at SAMPLE_LEVEL and LANE_LEVEL, n the
    lane level's bound; P / step for the host's programs) are below the batch. The core counts
    the samples as it walks them (ember_hw.sample_engine), so a program whose lane level is not
    that wide runs the same there."""
    step = lane_step(ph.kind, build)
    first = (indices[SAMPLE_LEVEL[ph.kind]] * ph.bounds[LANE_LEVEL[ph.kind]]
             + indices[LANE_LEVEL[ph.kind]]) * step
    return min(max(batch - first, 0), step)


def execute(phases, mem, batch, counts=None, zero_skip=True, settings=None):
    """Run `phases` on `mem` as the v2 engine does at batch `batch` (the core's batch
    register: at most the capacity the phases were compiled for; the lanes past it are dead,
    block_lanes and step_samples); add the events to `counts` (a dict of spec.COUNTERS) and
    return (counts, correct: the samples the loss phase classified right). `settings`
    (spec.StepSettings) are the step's registers; inference uses zero_skip alone."""
    c = counts if counts is not None else dict.fromkeys(spec.COUNTERS, 0)
    if settings is None:
        settings = StepSettings(zero_skip=zero_skip)
    n_layers = max((ph.layer for ph in phases), default=0) + 1
    run = _Run(mem, settings, n_layers, c)
    run.batch = batch
    for ph in phases:
        if ph.kind in BACKWARD_KINDS:
            if ph.kind == "select":
                run.layer_skips(ph)
                run.correction += run.pending
                run.pending = 0
                run.largest = 0
            if not run.runs(ph):
                continue
        _KIND[ph.kind](run, ph)
    if any(ph.kind == "loss" for ph in phases):
        c["batches"] += 1
        c["samples"] += run.batch
    return c, run.correct


def _forward(run, ph):
    mem, c, P = run.mem, run.c, run.mem.P
    acc = np.zeros(P, dtype=np.int64)
    zs = run.st.zero_skip
    for idx, addr, first, last in ph.walk():
        live = block_lanes(ph, idx, run.batch, P)
        lanes = int(live.sum())
        a = mem.acts[addr["a"]]
        on = live & ((a != 0) if zs else True)
        if first[INNER]:
            acc[:] = 0
        acc += np.where(on, mem.weights[addr["w"]] * a, 0)
        c["mac_forward"] += int(on.sum())
        c["skip_zero"] += int((live & ~on).sum())
        c["weight_reads"] += int(on.any())
        c["act_reads"] += lanes
        if last[INNER]:
            y = requantize(acc, ph.shift, relu=ph.kind == "forward")
            if ph.kind == "forward":
                mem.acts[addr["o"], :lanes] = y[:lanes]
                c["act_writes"] += lanes
            else:
                mem.grads[addr["o"], :lanes] = y[:lanes]
                c["grad_writes"] += lanes


def _argmax(run, ph):
    # the first maximum of each sample's logits; w is the class, o the sample
    mem, c, P = run.mem, run.c, run.mem.P
    best = best_n = 0
    for idx, addr, first, last in ph.walk():
        if not step_samples(ph, idx, run.batch, mem.build):
            continue
        logit = mem.grads[addr["a"], addr["o"] % P]
        c["grad_reads"] += 1
        if first[INNER] or logit > best:
            best, best_n = logit, addr["w"]
        if last[INNER]:
            mem.preds[addr["o"]] = best_n
            c["infer_samples"] += 1


def _loss(run, ph):
    # lane_step (D) samples a step, one in each lane block of S = P / D lanes: sample
    # o + i * S's N logits (words a .. a + N - 1, lane i * S + o % S) to dY in place, for
    # the samples below the batch (ember_hw.sample_engine's D loss units)
    mem, n = run.mem, ph.outputs
    D = lane_step(ph.kind, mem.build)
    S = mem.P // D
    for idx, addr, first, last in ph.walk():
        o = addr["o"]
        for i in range(D):
            if o + i * S < run.batch:
                _loss_sample(run, o + i * S, i * S + o % S, slice(addr["a"], addr["a"] + n),
                             n)


def _loss_sample(run, sample, lane, rows, n):
    """Sample `sample`'s logits (gradient words `rows`, lane `lane`) to dY in place."""
    mem, c = run.mem, run.c
    z = mem.grads[rows, lane].copy()
    label = mem.labels[sample]
    mem.grads[rows, lane] = softmax_grad(z[None, :], [label])[0]
    run.correct += int(argmax_first(z[None, :])[0] == label)
    c["loss_elements"] += n
    c["grad_reads"] += 3 * n
    c["grad_writes"] += n


def _select(run, ph):
    # ssProp: the kept channels (ascending); every channel when dense
    mem, c, P, n = run.mem, run.c, run.mem.P, ph.outputs
    keep = keep_count(n, run.st.keep_q8)
    if keep == n:
        run.kept = list(range(n))
        return
    if run.st.ssprop_random:
        scores, run.lfsr = lfsr_sequence(run.lfsr, n)
    else:
        scores = np.zeros(n, dtype=np.int64)
        for idx, addr, first, last in ph.walk():
            live = block_lanes(ph, idx, run.batch, P)
            scores[idx[INNER - 1]] += int(np.abs(mem.grads[addr["g"]][live]).sum())
            c["grad_reads"] += int(live.sum())
    run.kept = [int(j) for j in np.flatnonzero(select_channels(scores, keep))]


def _kept_walk(run, ph):
    """The phase's steps over the kept channels: (indices, addresses, first, last, j), the
    kept channel's j added to g and j * K to w."""
    level = KEPT_LEVEL[ph.kind]
    kept = run.kept
    if ph.kind != "input_grad":
        ph = ph.with_bound(PASS_LEVEL, 1)   # the executor forms both passes of a (j, k) itself
    for idx, addr, first, last in ph.with_bound(level, len(kept)).walk():
        j = kept[idx[level]]
        addr["w"] += j * ph.inputs
        addr["g"] += j
        yield idx, addr, first, last, j


def _input_grad(run, ph):
    mem, c, P = run.mem, run.c, run.mem.P
    zs = run.st.zero_skip
    acc = np.zeros(P, dtype=np.int64)
    run.dx_max = 0
    for idx, addr, first, last, j in _kept_walk(run, ph):
        live = block_lanes(ph, idx, run.batch, P)
        relu = mem.acts[addr["a"]] > 0
        on = live & (relu if zs else True)
        if first[INNER]:
            acc[:] = 0
            c["act_reads"] += int(live.sum())
        acc += np.where(on, mem.weights[addr["w"]] * mem.grads[addr["g"]], 0)
        c["mac_input_grad"] += int(on.sum())
        c["skip_zero"] += int((live & ~on).sum())
        c["weight_reads"] += int(on.any())
        c["grad_lane_reads"] += int(on.sum())
        if last[INNER]:
            dx = np.where(relu, saturate(acc, spec.DX_BITS), 0)
            lanes = int(live.sum())
            # the drain writes drain_lanes entries a cycle, from o rounded down to a
            # multiple of them (the compiler's o is a multiple of P)
            o = addr["o"] - addr["o"] % mem.build.drain_lanes
            mem.scratch[o:o + lanes] = dx[:lanes]
            run.dx_max = max([run.dx_max] + [abs(int(v)) for v in dx[:lanes]])
            c["grad_writes"] += lanes
    run.dx_shift = max(0, bit_length(run.dx_max) - (spec.GRAD_BITS - 1))


def _requant(run, ph):
    """lane_step samples a step: entries a .. a + D - 1 (a rounded down to a multiple of D,
    one word of the scratch's D banks) into lanes a % P .. of gradient word o."""
    mem, c, P = run.mem, run.c, run.mem.P
    D = lane_step(ph.kind, mem.build)
    for idx, addr, first, last in ph.walk():
        a = addr["a"] - addr["a"] % D
        for i in range(step_samples(ph, idx, run.batch, mem.build)):
            dx = mem.scratch[a + i]
            mem.grads[addr["o"], (a + i) % P] = saturate_grad(round_shift(dx, run.dx_shift))
            c["grad_reads"] += 1
            c["grad_writes"] += 1
    # the layers below update with this layer's dX scale in their shift (from the next
    # layer's select phase on: this layer's own update does not)
    run.pending = spec.WEIGHT_FRAC_BITS - run.dx_shift


def _hi_dy(dy):
    return np.sign(dy) * (np.abs(dy) >> (spec.GRAD_BITS - spec.PSG_GRAD_MSBS))


def _groups(run, ph):
    """The weight-gradient nest's steps by group (a kept channel's GRAD_HOLD inputs): lists
    of (addr, live, on, first_of_block) in loop order (blocks, then the group's inputs)."""
    P, zs = run.mem.P, run.st.zero_skip
    group = []
    for idx, addr, first, last, j in _kept_walk(run, ph):
        live = block_lanes(ph, idx, run.batch, P)
        on = live & ((run.mem.acts[addr["a"]] != 0) if zs else True)
        group.append((addr, live, on, first[INNER]))
        if all(last[PASS_LEVEL:]):
            yield group
            group = []


def _low_pass(run, group):
    """PSG's prediction of each input of a group (o: its index): the high bits' products
    summed over the lanes and blocks; counts the pass's events."""
    mem, c = run.mem, run.c
    pred = {}
    for addr, live, on, first in group:
        if first:                               # the block's dY word, held for the group
            c["grad_msb_lane_reads"] += int(live.sum())
        hi_a = mem.acts[addr["a"]] >> (spec.ACT_BITS - spec.PSG_ACT_MSBS)
        pred[addr["o"]] = pred.get(addr["o"], 0) + int(
            np.where(on, _hi_dy(mem.grads[addr["g"]]) * hi_a, 0).sum())
        c["mac_weight_grad_low"] += int(on.sum())
        c["act_msb_reads"] += int(live.sum())
    return pred


def _psg_max(run, ph):
    # PSG's relative threshold: the layer's largest |prediction| over the kept channels
    for group in _groups(run, ph):
        run.largest = max([run.largest] + [abs(v) for v in _low_pass(run, group).values()])
    run.psg_tau = run.largest >> run.st.psg_tau


def _weight_grad(run, ph):
    """The weight gradient of each (j, k) of a group summed over the lanes and blocks, then
    its update: SGD, or PSG's sign step (the prediction's sign where it is confident;
    otherwise a full-precision pass over the group's blocks first)."""
    mem, c, st = run.mem, run.c, run.st
    shift = min(max(st.lr_shift + run.correction, 0), spec.UPDATE_SHIFT_MAX)
    tau = run.psg_tau if st.psg_relative else st.psg_tau
    for group in _groups(run, ph):
        c["skip_zero"] += sum(int((live & ~on).sum()) for _, live, on, _ in group)
        if st.psg:
            pred = _low_pass(run, group)
            sure = {o: abs(v) > tau for o, v in pred.items()}
            for addr, live, on, first in group:
                if sure[addr["o"]]:
                    c["skip_psg"] += int(on.sum())
            full = _full_pass(run, group, [o for o, v in sure.items() if not v])
        else:
            full = _full_pass(run, group, None)
        for o in sorted({a["o"] for a, _, _, _ in group}):
            waddr = next(a["w"] for a, _, _, _ in group if a["o"] == o)
            w = int(mem.weights[waddr])
            if st.psg:
                sign = int(np.sign(pred[o])) if sure[o] else int(np.sign(full[o]))
                new = int(sign_update(w, sign, st.psg_step_shift))
            else:
                new = int(sgd_update(w, full[o], shift))
            c["weight_reads"] += 1
            if new != w:
                mem.weights[waddr] = new
                c["weight_writes"] += 1


def _full_pass(run, group, inputs):
    """The full-precision sums of a group's inputs (all, or `inputs`: PSG's uncertain ones);
    the block's dY word is read once for the group if any input needs it."""
    mem, c = run.mem, run.c
    g = {}
    wanted = (lambda o: True) if inputs is None else (lambda o: o in inputs)
    if inputs is not None and not inputs:
        return g
    for addr, live, on, first in group:
        if first:
            c["grad_lane_reads"] += int(live.sum())
        if not wanted(addr["o"]):
            continue
        g[addr["o"]] = g.get(addr["o"], 0) + int(
            np.where(on, mem.grads[addr["g"]] * mem.acts[addr["a"]], 0).sum())
        c["mac_weight_grad"] += int(on.sum())
        c["act_reads"] += int(live.sum())
    return g


_KIND = {"forward": _forward, "logits": _forward, "argmax": _argmax, "loss": _loss,
         "select": _select, "input_grad": _input_grad, "requant": _requant,
         "weight_grad": _weight_grad, "psg_max": _psg_max}
