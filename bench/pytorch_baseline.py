"""PyTorch eager baseline for `train_bench --device cuda` (issue: GPU backend).

The same layers as recflow's canned DNN (784-256-128-10, relu) and CNN
(conv 32 3x3 SAME relu, max pool 2, conv 64, max pool 2, dense 128 relu,
dropout 0.25, dense 10) on batches of 128 already on the GPU, Adam 1e-3,
softmax cross-entropy: a plain training loop, timed after a warm-up with a
synchronisation at the end.  PyTorch's defaults are kept (TF32 for cuDNN
convolutions, full float32 for matrix products).

  python3 bench/pytorch_baseline.py [steps] [--cpu THREADS]
With --cpu, the same loop on the CPU with THREADS intra-op threads (the
baseline of issue 17's 16-core targets, next to `train_bench`'s
Step/<model>/threads:THREADS).
"""
import json
import sys
import time

import torch
from torch import nn

ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
CPU_THREADS = (int(sys.argv[sys.argv.index("--cpu") + 1])
               if "--cpu" in sys.argv else 0)
if CPU_THREADS:
    ARGS = [a for a in ARGS if a != str(CPU_THREADS)]
STEPS = int(ARGS[0]) if ARGS else 2000
BATCH = 128


def dnn():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(),
                         nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(7 * 7 * 64, 128), nn.ReLU(), nn.Dropout(0.25),
        nn.Linear(128, 10))


def sync():
    if not CPU_THREADS:
        torch.cuda.synchronize()


def run(name, make):
    if CPU_THREADS:
        torch.set_num_threads(CPU_THREADS)
    dev = torch.device("cpu" if CPU_THREADS else "cuda")
    torch.manual_seed(0)
    model = make().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randint(0, 256, (BATCH, 1, 28, 28), device=dev,
                      dtype=torch.uint8)
    y = torch.randint(0, 10, (BATCH,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x.float() / 255), y)
        loss.backward()
        opt.step()

    for _ in range(50):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(STEPS):
        step()
    sync()
    seconds = time.perf_counter() - start
    return {"model": name, "examples_per_s": STEPS * BATCH / seconds,
            "step_ms": seconds / STEPS * 1e3,
            "device": (f"cpu ({CPU_THREADS} threads)" if CPU_THREADS
                       else torch.cuda.get_device_name(0)),
            "torch": torch.__version__}


if __name__ == "__main__":
    for name, make in (("dnn", dnn), ("cnn", cnn)):
        print(json.dumps(run(name, make)))
