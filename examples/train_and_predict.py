"""Train on a data set of your own, save the network, and predict samples it has not seen.

    python examples/train_and_predict.py [model|sim|PORT]

The data set is tabular: 10 features whose ranges differ by 10^4 (0.7 to 9,552), each scaled
to the engine's inputs by the range it has on the training split.
"""

import os
import sys
import tempfile

import numpy as np

import ember

target = sys.argv[1] if len(sys.argv) > 1 else "model"

# three classes of Gaussian samples, each feature in units of its own size
rng = np.random.default_rng(0)
centres = rng.normal(size=(3, 10)) * 1.5
labels = rng.integers(0, 3, size=1000)
sizes = np.logspace(-1, 3, 10)
samples = (centres[labels] + rng.normal(size=(1000, 10))) * sizes + 5 * sizes
known_x, known_y = samples[:900], labels[:900]      # for training (80 %) and testing (20 %)
new_x, new_y = samples[900:], labels[900:]          # never seen in training

with ember.open_device(target) as device:
    dataset = ember.load_dataset(known_x, known_y)   # scaling="minmax" by default
    net = ember.train(device, dataset, epochs=10, hidden=(32,))
    print(f"network {net.layers}: test accuracy {100 * net.test_accuracy:.1f} %, "
          f"energy {net.energy.energy_pj / 1e6:.2f} uJ")

    predicted = net.predict(new_x)                   # raw samples, in their own units
    print(f"first new samples: predicted {predicted[:10].tolist()}, "
          f"labels {new_y[:10].tolist()}")
    print(f"accuracy on {len(new_y)} new samples: {100 * (predicted == new_y).mean():.1f} %")

    path = os.path.join(tempfile.mkdtemp(prefix="ember-example-"), "net.ckpt")
    net.save(path)
    again = ember.load_checkpoint(path, device)
    same = np.array_equal(again.predict(new_x), predicted)
    print(f"saved to {path}; reloaded, it predicts the same: {same}")
