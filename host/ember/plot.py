"""`ember train --plot PATH`: a PNG of a run's test accuracy and energy, epoch by epoch.

Two panels sharing the epoch axis: test (and train) accuracy in percent, and the energy the
device spent in each epoch next to what the dense baseline would have spent, in microjoules
under the run's energy profile. Drawn with matplotlib's Agg backend (no display needed).
"""

from .spec import ConfigError


def require_matplotlib():
    """Raise ConfigError if matplotlib cannot be imported (checked before a run starts)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"--plot needs matplotlib ({e}); pip install matplotlib") from None


def plot_run(result, path, preset=None):
    """Write the PNG of a trainer result (its `history`) to `path`."""
    require_matplotlib()
    # a Figure on an Agg canvas: no pyplot, so no global backend switch and no display
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    history = result["history"]
    epochs = [h["epoch"] for h in history]
    # history holds running totals; the panels show each epoch's own share
    spent = [h["energy_pj"] for h in history]
    dense = [h["dense_energy_pj"] for h in history]
    per_epoch = [(b - a) / 1e6 for a, b in zip([0.0] + spent[:-1], spent)]
    dense_per_epoch = [(b - a) / 1e6 for a, b in zip([0.0] + dense[:-1], dense)]

    fig = Figure(figsize=(7, 6), layout="constrained")
    FigureCanvasAgg(fig)
    acc, en = fig.subplots(2, 1, sharex=True)
    acc.plot(epochs, [100 * h["test_accuracy"] for h in history], "o-", label="test")
    train = [(h["epoch"], 100 * h["train_accuracy"]) for h in history
             if h["train_accuracy"] is not None]
    if train:
        acc.plot(*zip(*train), "s--", alpha=0.6, label="train (before each update)")
    acc.set_ylabel("accuracy (%)")
    acc.grid(alpha=0.3)
    acc.legend(loc="lower right")
    en.bar(epochs, per_epoch, label=f"spent ({result['profile']})")
    en.plot(epochs, dense_per_epoch, "k_", markersize=14, label="dense baseline")
    en.set_ylabel("energy per epoch (\u00b5J)")
    en.set_xlabel("epoch")
    en.xaxis.set_major_locator(MaxNLocator(integer=True))
    # headroom so the legend sits above the bars and the baseline marks
    en.set_ylim(0, 1.4 * max(per_epoch + dense_per_epoch + [1e-6]))
    en.grid(alpha=0.3, axis="y")
    en.legend(loc="upper center", ncol=2)
    s = result["settings"]
    what = f"preset {preset}" if preset else "custom settings"
    fig.suptitle(f"Ember {result['backend']} backend, build {result['build']['build']}: "
                 f"{what}, {'-'.join(map(str, s['layers']))}, seed {s['seed']}")
    fig.savefig(path, format="png", dpi=100)
