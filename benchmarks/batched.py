"""Batched client training (runtime.batch_clients) against one client after the other.

K = 10 clients of one architecture, 480 samples each (1x28x28, random, seeded), one epoch of
SGD (lr 0.05, batch 32, momentum 0.9, weight decay 1e-4, clip 1.0): `training.local_sgd`
per client, then `batched.local_sgd_batched` for all ten (torch.func vmap). Best of 3.
`cnn_mnist` is timed with its dropout (the batched path draws each client's masks as the
serial path does) and without it (`cnn_mnist-no-dropout`): the difference is the masks'
cost. `resnet8` has batch normalisation.

    .venv/bin/python benchmarks/batched.py                 # 1 torch thread, CPU
    .venv/bin/python benchmarks/batched.py --threads 2
    .venv/bin/python benchmarks/batched.py --models cnn_mnist cnn_mnist-no-dropout
    .venv/bin/python benchmarks/batched.py --device cuda   # where a GPU is lent
"""

from __future__ import annotations

import argparse
import copy
import time
from types import SimpleNamespace

import torch
from torch import nn

from raymtl.algorithms.base import LocalTrainingParams
from raymtl.algorithms.batched import can_batch, local_sgd_batched
from raymtl.algorithms.training import local_sgd
from raymtl.models import build_model

CLIENTS, SAMPLES, SHAPE = 10, 480, (1, 28, 28)
MODELS = ("cnn_mnist", "cnn_mnist-no-dropout", "resnet8", "large_cnn", "mlp")
NO_DROPOUT = "-no-dropout"
PARAMS = LocalTrainingParams(
    epochs=1, lr=0.05, batch_size=32, momentum=0.9, weight_decay=1e-4, clip_grad=1.0
)


def models_of(name: str, device: str) -> list[nn.Module]:
    models = []
    for k in range(CLIENTS):
        torch.manual_seed(k)
        model = build_model(name.removesuffix(NO_DROPOUT), SHAPE, 10)
        if name.endswith(NO_DROPOUT):
            model.head.dropout = nn.Identity()
        models.append(model.to(device))
    return models


def timed(fn, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - began


def compare(name: str, xs, ys, device: str) -> dict:
    base, seeds, tasks = models_of(name, device), list(range(CLIENTS)), [None] * CLIENTS
    datas = [SimpleNamespace(train_x=x, train_y=y) for x, y in zip(xs, ys, strict=True)]
    assert can_batch(base, datas, PARAMS, tasks)
    serial_s, batched_s = [], []
    for _ in range(3):
        serial, batched = ([copy.deepcopy(m) for m in base] for _ in range(2))

        def one_by_one(models=serial):
            for model, x, y, seed in zip(models, xs, ys, seeds, strict=True):
                local_sgd(model, x, y, PARAMS, seed)

        def together(models=batched):
            local_sgd_batched(models, xs, ys, PARAMS, seeds, tasks)

        serial_s.append(timed(one_by_one, device))
        batched_s.append(timed(together, device))
    gap = max(
        (a - b).abs().max().item()
        for m1, m2 in zip(serial, batched, strict=True)
        for a, b in zip(m1.parameters(), m2.parameters(), strict=True)
    )
    return {"model": name, "serial_s": min(serial_s), "batched_s": min(batched_s), "gap": gap}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    xs = [torch.randn(SAMPLES, *SHAPE, generator=generator).to(args.device) for _ in range(CLIENTS)]
    ys = [
        torch.randint(0, 10, (SAMPLES,), generator=generator).to(args.device)
        for _ in range(CLIENTS)
    ]
    for name in args.models:
        r = compare(name, xs, ys, args.device)
        print(
            f"| {name} | {args.device}, {args.threads} thread(s) | {r['serial_s']:.3f} | "
            f"{r['batched_s']:.3f} | {r['serial_s'] / r['batched_s']:.2f}x | "
            f"{r['gap']:.1e} |"
        )


if __name__ == "__main__":
    main()
