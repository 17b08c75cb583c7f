import numpy as np
import pytest

from ember import data, golden, spec


@pytest.fixture(scope="session")
def digits():
    return data.load_digits()


def make_model(layers, seed=0, build=spec.DEFAULT_BUILD):
    m = golden.GoldenModel(build)
    m.configure(layers)
    m.load_weights(golden.init_weights(layers, seed))
    return m


def random_batch(rng, layers, batch, zero_fraction=0.5):
    x = rng.integers(1, 256, size=(batch, layers[0]))
    x[rng.random(x.shape) < zero_fraction] = 0
    y = rng.integers(0, layers[-1], size=batch)
    return x, y


def pytest_collection_modifyitems(config, items):
    """The bitstream builds first. The ULX3S's place and route is the suite's longest test
    (about 11 minutes of one core): `make test` runs the suite on two workers with work
    stealing (`--dist worksteal`), so the worker that starts it hands the tests queued
    behind it to the other one, and nothing waits for it at the end."""
    items.sort(key=lambda item: item.get_closest_marker("bitstream") is None)
