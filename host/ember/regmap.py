"""The engine's bus address map seen from the host: where every register, counter and memory
word is, and how the host lays a network, a batch and its settings out in them.

Everything derives from ember.spec (ADDRESS_MAP, REGISTERS, LAYER_FIELDS, COUNTERS), the same
definitions the gateware is elaborated from; `register_map()` exports them as a JSON document
(docs/protocol.md) so other tools need not import Python.
"""

import numpy as np

from . import spec
from .spec import ConfigError, StepSettings


def reg(name):
    """Bus word address of a register."""
    return spec.ADDRESS_MAP["regs"][0] + spec.REGISTERS[name][0]


def layer_field(layer, name):
    return (spec.ADDRESS_MAP["regs"][0] + spec.LAYER_BASE + layer * spec.LAYER_STRIDE
            + spec.LAYER_FIELDS.index(name))


def counter(name):
    """Bus address of a counter's low word (the high bits are at the next address)."""
    return spec.ADDRESS_MAP["counters"][0] + 2 * spec.COUNTERS.index(name)


def region(name):
    return spec.ADDRESS_MAP[name][0]


def layout(layers, build):
    """Descriptors of a network: for each layer its inputs, outputs, weight base (P-lane
    words), activation base (bytes; depends on the batch, so given per unit batch: multiply by
    the batch) and forward shift. Raises ConfigError if it does not fit the build."""
    layers = spec.check_network(layers, build)
    out, wbase = [], 0
    n_layers = len(layers) - 1
    for l, (k, n) in enumerate(zip(layers[:-1], layers[1:])):
        out.append({"inputs": k, "outputs": n, "weight_base": wbase,
                    "act_offset": sum(layers[:l]),
                    "shift": spec.HIDDEN_SHIFT if l < n_layers - 1 else spec.OUTPUT_SHIFT})
        wbase += build.blocks(n) * k
    return out


def descriptor_writes(layers, build, batch, shifts=None):
    """(address, value) writes that configure the network for batches of `batch` samples.
    Engine v2 (dataflow "samples") reads its memory layout from the program (program_writes):
    its descriptors' bases stay 0."""
    desc = layout(layers, build)
    if build.dataflow == "samples":
        desc = [dict(d, weight_base=0, act_offset=0) for d in desc]
    spec.check_network(layers, build, batch)
    # the watchdog's limit: the most cycles a command of this network and batch can take,
    # whatever its settings (a build without the watchdog unit drops the write)
    bound = max(spec.command_cycle_bound(build, layers, batch, train) for train in (True, False))
    if "resident" in build.features:
        # EVALUATE's runs infer max_batch samples (the watchdog limits each run: section 11)
        bound = min(max(bound, spec.command_cycle_bound(build, layers, build.max_batch, False)),
                    build.settings()["watchdog"].hi)
    writes = [(reg("layers"), len(desc)), (reg("batch"), batch), (reg("watchdog"), bound)]
    for l, d in enumerate(desc):
        values = {"inputs": d["inputs"], "outputs": d["outputs"],
                  "weight_base": d["weight_base"], "act_base": d["act_offset"] * batch,
                  "shift": d["shift"] if shifts is None else shifts[l]}
        writes += [(layer_field(l, f), values[f]) for f in spec.LAYER_FIELDS]
    return writes


def settings_writes(settings: StepSettings, n_layers):
    """(address, value) writes of one batch's step settings."""
    settings.check(n_layers)
    mask = sum(1 << i for i, on in enumerate(settings.mask(n_layers)) if on)
    flags = sum(1 << i for i, name in enumerate(spec.FLAG_BITS)
                if getattr(settings, name))
    return [(reg("update_mask"), mask), (reg("lr_shift"), settings.lr_shift),
            (reg("flags"), flags), (reg("psg_tau"), settings.psg_tau),
            (reg("psg_step_shift"), settings.psg_step_shift),
            (reg("keep_q8"), settings.keep_q8), (reg("lfsr_seed"), settings.lfsr_seed)]


def _v2_weight_image(layers, build):
    from . import dataflow
    wbase, _, _ = dataflow.layout(layers, build, 1)
    total = sum(k * n for k, n in zip(layers[:-1], layers[1:]))
    return wbase, total + total % 2


def pack_weights(weights, layers, build):
    """Weights -> {bus address: word}: word w, lane p of the weight memory is at
    weights + (w * P + p) // 2, even lane in the low half. Lanes past a layer's outputs are 0.
    Engine v2: weight i of the network (ember.dataflow.layout) in the halves of word i // 2."""
    P = build.lanes
    if build.dataflow == "samples":
        wbase, size = _v2_weight_image(layers, build)
        flat = np.zeros(size, dtype=np.int64)
        for base, w in zip(wbase, weights):
            flat[base:base + w.size] = np.asarray(w, dtype=np.int64).reshape(-1)
        flat &= 0xFFFF
        return {region("weights") + i: int(v)
                for i, v in enumerate(flat[0::2] | (flat[1::2] << 16))}
    words = {}
    for d, w in zip(layout(layers, build), weights):
        n, k = w.shape
        blocks = build.blocks(n)
        lanes = np.zeros((blocks * P, k), dtype=np.int64)
        lanes[:n] = w
        # memory word (j, k) holds lanes[j*P : j*P+P, k]
        mem = lanes.reshape(blocks, P, k).transpose(0, 2, 1).reshape(-1, P)  # (blocks*k, P)
        flat = (mem & 0xFFFF).reshape(-1)
        pairs = flat[0::2] | (flat[1::2] << 16)
        base = region("weights") + d["weight_base"] * P // 2
        for i, v in enumerate(pairs):
            words[base + i] = int(v)
    return words


def unpack_weights(read, layers, build):
    """Read the weights back: `read(address, count)` returns that many bus words."""
    P = build.lanes
    out = []
    if build.dataflow == "samples":
        wbase, size = _v2_weight_image(layers, build)
        pairs = np.array(read(region("weights"), size // 2), dtype=np.int64)
        flat = np.empty(size, dtype=np.int64)
        flat[0::2], flat[1::2] = pairs & 0xFFFF, (pairs >> 16) & 0xFFFF
        flat = np.where(flat >= 0x8000, flat - 0x10000, flat)
        return [flat[b:b + n * k].reshape(n, k).astype(np.int16)
                for b, k, n in zip(wbase, layers[:-1], layers[1:])]
    for d in layout(layers, build):
        n, k = d["outputs"], d["inputs"]
        blocks = build.blocks(n)
        count = blocks * k * P // 2
        pairs = np.array(read(region("weights") + d["weight_base"] * P // 2, count),
                         dtype=np.int64)
        flat = np.empty(2 * count, dtype=np.int64)
        flat[0::2], flat[1::2] = pairs & 0xFFFF, (pairs >> 16) & 0xFFFF
        flat = np.where(flat >= 0x8000, flat - 0x10000, flat)
        lanes = flat.reshape(blocks, k, P).transpose(0, 2, 1).reshape(blocks * P, k)
        out.append(lanes[:n].astype(np.int16))
    return out


def pack_bytes(values):
    """Bytes, four per little-endian bus word."""
    v = np.asarray(values, dtype=np.int64).reshape(-1)
    v = np.concatenate([v, np.zeros((-len(v)) % 4, dtype=np.int64)])
    return [int(x) for x in v[0::4] | (v[1::4] << 8) | (v[2::4] << 16) | (v[3::4] << 24)]


def pack_halves(values):
    """16-bit values, two per bus word (labels)."""
    v = np.asarray(values, dtype=np.int64).reshape(-1)
    v = np.concatenate([v, np.zeros(len(v) % 2, dtype=np.int64)])
    return [int(x) for x in (v[0::2] & 0xFFFF) | ((v[1::2] & 0xFFFF) << 16)]


def unpack_halves(words, count):
    w = np.asarray(words, dtype=np.int64)
    v = np.empty(2 * len(w), dtype=np.int64)
    v[0::2], v[1::2] = w & 0xFFFF, (w >> 16) & 0xFFFF
    return v[:count]


def input_image(x, build):
    """The input batch's bytes as the activation memory holds them: four to a bus word from
    the region's start; engine v2 interleaves the samples (sample b = s * P + p, input k at
    byte (s * K + k) * P + p; the last block's lanes past the batch are 0)."""
    x = np.asarray(x, dtype=np.int64)
    if build.dataflow != "samples":
        return x
    B, K = x.shape
    P = build.lanes
    S = build.sample_blocks(B)
    image = np.zeros((S * P, K), dtype=np.int64)
    image[:B] = x
    return image.reshape(S, P, K).transpose(0, 2, 1)      # (s, k, p)


def batch_writes(x, y=None, build=None):
    """Writes of an input batch (and labels) as (base address, words) bursts."""
    bursts = [(region("acts"), pack_bytes(x if build is None else input_image(x, build)))]
    if y is not None:
        bursts.append((region("labels"), pack_halves(y)))
    return bursts


def data_writes(x, y):
    """Writes of resident samples (docs/protocol.md section 11): their input bytes to the data
    region (sample i's input k at byte i * spec.sample_data_bytes(K) + k: each sample padded
    with zeros to a whole word) and their labels to data_labels, as bursts."""
    x = np.asarray(x)
    padded = np.zeros((len(x), spec.sample_data_bytes(x.shape[1])), dtype=np.int64)
    padded[:, :x.shape[1]] = x
    return [(region("data"), pack_bytes(padded)), (region("data_labels"), pack_halves(y))]


def schedule_writes(words, first=0, size=None):
    """An epoch's schedule words (ember.schedule.EpochSchedule.words) from word `first` of
    the schedule region on, wrapping at its `size` words (Build.data_samples): one burst, or
    two where they wrap."""
    words = [int(w) for w in words]
    size = size or first + len(words)
    head = words[:size - first]
    out = [(region("schedule") + first, head)]
    if len(words) > len(head):
        out.append((region("schedule"), words[len(head):]))
    return out


def program_writes(words):
    """The program memory's words (ember.dataflow.encode) as one burst."""
    return [(region("program"), [int(w) for w in words])]


def counters_from_words(words):
    """2 words per counter (low 32 bits, high bits) -> {name: value}."""
    return {name: int(words[2 * i]) | (int(words[2 * i + 1]) << 32)
            for i, name in enumerate(spec.COUNTERS)}


def _ranges(table):
    return {name: {"bits": s.bits, "min": s.lo, "max": s.hi, "init": s.init,
                   "feature": s.feature} for name, s in table.items()}


def register_map():
    """The whole map as a JSON-ready dict (what docs/protocol.md's table is made from)."""
    return {
        "regions": {k: {"base": b, "words": s} for k, (b, s) in spec.ADDRESS_MAP.items()},
        "registers": {k: {"address": reg(k), "access": a} for k, (o, a) in
                      spec.REGISTERS.items()},
        "layer_fields": {f: [layer_field(l, f) for l in range(spec.MAX_LAYERS)]
                         for f in spec.LAYER_FIELDS},
        "counters": {c: counter(c) for c in spec.COUNTERS},
        # per build: each read-write setting's and descriptor field's register width, legal
        # range, reset value and the optional unit it belongs to
        "settings": {name: _ranges(build.settings()) for name, build in spec.BUILDS.items()},
        "layer_field_ranges": {name: _ranges(build.descriptor_fields())
                               for name, build in spec.BUILDS.items()},
        # per build: the words of engine v2's program memory (the program region's offsets
        # below it are its words; past it, out_of_range)
        "program_words": {name: build.program_words for name, build in spec.BUILDS.items()},
        "flags": {f: 1 << i for i, f in enumerate(spec.FLAG_BITS)},
        "control": {"train": spec.CONTROL_TRAIN, "infer": spec.CONTROL_INFER,
                    "clear_counters": spec.CONTROL_CLEAR_COUNTERS, "abort": spec.CONTROL_ABORT,
                    "epoch": spec.CONTROL_EPOCH, "evaluate": spec.CONTROL_EVALUATE},
        # per build: the resident data memory's input bytes and labelled samples (0: none)
        "data_bytes": {name: build.data_bytes for name, build in spec.BUILDS.items()},
        "data_samples": {name: build.data_samples for name, build in spec.BUILDS.items()},
        # an epoch's schedule word: the LFSR seed's bits, the update mask's lowest bit, the
        # drop bit (ember.schedule)
        "schedule_word": {"seed_bits": spec.SCHEDULE_SEED_BITS,
                          "mask_lsb": spec.SCHEDULE_MASK_LSB,
                          "drop_bit": spec.SCHEDULE_DROP_BIT},
        # STOPPED's fields: lowest bit and width
        "stop_fields": {name: {"lo": lo, "bits": bits}
                        for name, (lo, bits) in spec.STOP_FIELDS.items()},
        "status": {name: code for name, code in spec.LINK_STATUS.items()},
        # REJECTED reads 1 + the index of the check a refused command failed
        "command_checks": list(spec.COMMAND_CHECKS),
    }



def main():
    import json
    print(json.dumps(register_map(), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
