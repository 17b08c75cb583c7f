"""Train on the simulated board; a real board is one argument away.

    python examples/train_on_board.py                  # the simulated board (Verilator)
    python examples/train_on_board.py /dev/ttyUSB1     # a real board on that serial port
    python examples/train_on_board.py model            # the bit-exact model, in seconds
"""

import sys

import ember

target = sys.argv[1] if len(sys.argv) > 1 else "sim"
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 3

with ember.open_device(target) as device:         # the one argument: "sim" or a port
    digits = ember.load_dataset("digits")
    # batch 16 and 64-32-10 fit every build, the iCEBreaker's too
    net = ember.train(device, digits, preset="e2train", epochs=epochs, batch_size=16)
    print(f"{device.backend}: network {net.layers}, test accuracy "
          f"{100 * net.test_accuracy:.1f} %")
    print(f"energy: {net.energy}")
    print(f"engine cycles: {net.energy.cycles:,}")
