"""What does each piece of the toolbox (docs/ALGORITHMS.md §9) add to a round?

The overhead workload (benchmarks/overhead.py's: FedAvg, Fashion-MNIST, 20 clients of at most
500 samples, 2 classes each, `cnn_mnist`, 1 local epoch, every client every round) run through
`raymtl.run` once plainly (the baseline) and once per piece: an aggregation rule, a server
optimiser, client-level DP, an uplink compressor, an attack. `runtime.executor: inline`: the
hosts live in this process, so the figures are the toolbox's maths (and the training they sit
beside), not Ray's messaging. A round's seconds come from rounds.parquet: seconds_train +
seconds_aggregate + seconds_receive (evaluation excluded: it runs once, after the last round);
"outside" is what the round's wall time holds beyond its phases (the DP accountant's ε).

The machine is shared and noisy, so the baseline is interleaved (B, P1, P2, B, P3, P4, B, ...)
and each piece is compared with the baselines either side of it; a run's figure is the median
of its rounds. Krum's cost grows as m²·d: it is also measured at 10, 20 and 40 clients (every
client every round, `--scaling-max-samples` samples each: the aggregation does not depend on
them) against the mean at the same m. A last table times the uplink maths alone (attacks,
client clipping and noise, the compressors with error feedback and their decoding) on
cnn_mnist-sized updates, since the training's noise hides them in a round's figure. The
inline hosts set torch to 1 thread (runtime.num_cpus_per_actor), and so does that table.
Sample-level DP-SGD (privacy.sample_level) joins the pieces once local training reads it.

    .venv/bin/python benchmarks/toolbox.py                  # 3 rounds a run
    .venv/bin/python benchmarks/toolbox.py --record         # append to RESULTS.md
    .venv/bin/python benchmarks/toolbox.py --only krum,fedadam --no-scaling
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import re
import statistics
import subprocess
import tempfile
import time
import traceback
from datetime import date
from pathlib import Path

import torch

import raymtl
from raymtl.models import build_model

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).with_name("RESULTS.md")
PHASES = ("seconds_train", "seconds_aggregate", "seconds_receive")
CENTRAL = {"clip": 1.0, "noise_multiplier": 1.0}
EF = {"error_feedback": True}

# (name, the experiment's toolbox sections): §9.1-9.5, in the order they run.
PIECES: list[tuple[str, dict]] = [
    ("aggregation median", {"aggregation": {"rule": "median"}}),
    ("aggregation trimmed_mean β 0.1", {"aggregation": {"rule": "trimmed_mean", "beta": 0.1}}),
    ("aggregation krum f 2", {"aggregation": {"rule": "krum", "f": 2}}),
    ("aggregation multi_krum f 2", {"aggregation": {"rule": "multi_krum", "f": 2}}),
    ("server_optimizer fedadam", {"server_optimizer": {"name": "fedadam"}}),
    ("server_optimizer fedyogi", {"server_optimizer": {"name": "fedyogi"}}),
    ("server_optimizer fedadagrad", {"server_optimizer": {"name": "fedadagrad"}}),
    ("server_optimizer momentum", {"server_optimizer": {"name": "momentum"}}),
    ("privacy central fixed, C 1, σ 1", {"privacy": CENTRAL}),
    ("privacy central adaptive, C₀ 1, σ 1", {"privacy": CENTRAL | {"clipping": "adaptive"}}),
    ("privacy local, C 1, σ 1", {"privacy": CENTRAL | {"noise": "local"}}),
    (
        "compression topk 1 % + EF",
        {"compression": {"uplink": {"kind": "topk", "ratio": 0.01} | EF}},
    ),
    (
        "compression qsgd 127 + EF",
        {"compression": {"uplink": {"kind": "qsgd", "levels": 127} | EF}},
    ),
    ("compression sign + EF", {"compression": {"uplink": {"kind": "sign"} | EF}}),
    ("attack sign_flip 20 %", {"attack": {"fraction": 0.2, "kind": "sign_flip"}}),
    ("attack gaussian 20 %", {"attack": {"fraction": 0.2, "kind": "gaussian"}}),
    ("attack label_flip 20 %", {"attack": {"fraction": 0.2, "kind": "label_flip"}}),
]
SAMPLE_LEVEL = (
    "privacy sample_level DP-SGD, C_s 1, σ_s 1",
    {"privacy": {"sample_level": {"clip": 1.0, "noise_multiplier": 1.0}}},
)


def sample_level_wired() -> bool:
    """Whether local training reads `privacy.sample_level` (the section validates whether or
    not anything applies it)."""
    found = subprocess.run(
        ["grep", "-rln", "sample_level", "raymtl/algorithms/training.py", "raymtl/runtime"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return bool(found.stdout.strip())


def experiment(args, out: Path, clients: int | None = None, max_samples: int | None = None):
    return {
        "name": "toolbox",
        "data": {
            "name": "fashion_mnist",
            "num_clients": clients or args.clients,
            "partition": {
                "kind": "classes_per_client",
                "classes_per_client": 2,
                "max_samples_per_client": max_samples or args.max_samples,
            },
        },
        "model": {"name": "cnn_mnist"},
        "algorithm": {
            "name": "fedavg",
            "params": {"epochs": args.epochs, "lr": 0.05, "sample_fraction": 1.0},
        },
        "rounds": args.rounds,
        "eval_every": args.rounds,  # once, after the last round (not in the phases' seconds)
        "checkpoint_every": args.rounds,
        "runtime": {"executor": "inline", "dashboard": False},
        "output": {"dir": str(out), "plots": False},
    }


def run_once(cfg: dict) -> dict:
    """One run: the median over its rounds of the round's seconds (phases summed), of the
    aggregation phase alone, and of what lies outside the phases."""
    rows = raymtl.run(cfg).rounds.sort_values("round")
    phases = rows[list(PHASES)].sum(axis=1)
    wall = rows["wall_time"].diff().fillna(rows["wall_time"])
    outside = wall - phases - rows["seconds_evaluate"].fillna(0.0)
    return {
        "total": float(phases.median()),
        "aggregate": float(rows["seconds_aggregate"].median()),
        "train": float(rows["seconds_train"].median()),
        "outside": float(outside.median()),
        "rounds": [round(float(x), 2) for x in phases],
    }


def with_sections(base: dict, sections: dict) -> dict:
    cfg = copy.deepcopy(base)
    cfg.update(copy.deepcopy(sections))
    return cfg


def interleaved(args, base: dict, pieces: list[tuple[str, dict]]) -> tuple[list, list]:
    """B, P1, P2, B, P3, P4, B, ...: the baselines' figures, and for each piece its figures
    and the indices of the baselines either side of it (or the error it raised)."""
    baselines, measured = [], []

    def baseline():
        result = run_once(base)
        baselines.append(result)
        print(
            f"  baseline                                  {result['total']:6.2f} s/round "
            f"(aggregate {result['aggregate']:.3f}) rounds {result['rounds']}",
            flush=True,
        )

    baseline()
    for start in range(0, len(pieces), args.between):
        for name, sections in pieces[start : start + args.between]:
            try:
                result = run_once(with_sections(base, sections))
            except Exception as error:  # a raymtl error: recorded, the others still run
                message = "".join(traceback.format_exception_only(type(error), error)).strip()
                measured.append({"name": name, "error": message})
                print(f"  {name:<42} FAILED: {message}", flush=True)
                continue
            result |= {"name": name, "before": len(baselines) - 1}
            measured.append(result)
            print(
                f"  {name:<42}{result['total']:6.2f} s/round "
                f"(aggregate {result['aggregate']:.3f}) rounds {result['rounds']}",
                flush=True,
            )
        baseline()
    for result in measured:
        if "before" in result:
            result["after"] = result["before"] + 1
    return baselines, measured


def compared(baselines: list, result: dict) -> dict:
    """The piece's added seconds against the mean of the two baselines either side of it."""
    around = [baselines[result["before"]], baselines[result["after"]]]
    total = statistics.mean(b["total"] for b in around)
    aggregate = statistics.mean(b["aggregate"] for b in around)
    return {
        "baseline": total,
        "added": result["total"] - total,
        "percent": 100 * (result["total"] - total) / total,
        "aggregate_added": result["aggregate"] - aggregate,
    }


def krum_scaling(args, out: Path) -> list[dict]:
    """seconds_aggregate of the mean and of Krum (f 2) at 10, 20, 40 clients, all sampled."""
    rows = []
    for clients in args.scaling_clients:
        base = experiment(args, out, clients=clients, max_samples=args.scaling_max_samples)
        rounds = args.scaling_rounds
        base |= {"rounds": rounds, "eval_every": rounds, "checkpoint_every": rounds}
        mean = run_once(base)
        krum = run_once(with_sections(base, {"aggregation": {"rule": "krum", "f": 2}}))
        rows.append({"clients": clients, "mean": mean["aggregate"], "krum": krum["aggregate"]})
        print(
            f"  m = {clients:3d}: aggregate mean {mean['aggregate']:.3f} s, "
            f"krum {krum['aggregate']:.3f} s",
            flush=True,
        )
    return rows


def uplink_maths(args, repeats: int = 5) -> dict[str, tuple]:
    """Seconds per round of the uplink's maths alone (raymtl.toolbox's functions, as
    raymtl/runtime/hosts/uplink.py calls them) on `args.clients` cnn_mnist-sized updates, the
    fastest of `repeats` rounds (the shared machine's bursts only ever add): piece -> (the
    clients' hosts: attack, clip and noise, compression with error feedback; the aggregator's
    decoding, which its phase holds; for scale, a round's bare local training timed just
    before it: one epoch of `local_sgd` on 0.8·max_samples random samples per client, without
    the hosts' bookkeeping)."""
    from raymtl.extend import LocalTrainingParams, local_sgd
    from raymtl.toolbox.attacks import attack_update
    from raymtl.toolbox.compression import compress, decode
    from raymtl.toolbox.privacy import clip_update, gaussian_noise_like
    from raymtl.toolbox.settings import UplinkCodec

    torch.set_num_threads(1)  # what every host runs with (runtime.num_cpus_per_actor: 1)
    clients = args.clients
    model = build_model("cnn_mnist", (1, 28, 28), 10)
    generator = torch.Generator().manual_seed(0)
    deltas = [
        {n: 0.01 * torch.randn(t.shape, generator=generator) for n, t in model.state_dict().items()}
        for _ in range(clients)
    ]
    malicious = deltas[: int(round(0.2 * clients))]
    samples = int(0.8 * args.max_samples)
    train_x = torch.randn(samples, 1, 28, 28, generator=generator)
    train_y = torch.randint(0, 10, (samples,), generator=generator)
    params = LocalTrainingParams(epochs=args.epochs, lr=0.05)

    def timed(one_round) -> float:
        one_round()  # warm (and the residuals of error feedback filled)
        seconds = []
        for _ in range(repeats):
            began = time.perf_counter()
            one_round()
            seconds.append(time.perf_counter() - began)
        return min(seconds)

    initial = {n: t.clone() for n, t in model.state_dict().items()}

    def training() -> float:
        """A round's local training: 4 clients' epochs from the same model (as a round's
        clients start from the global one; random data diverges if trained on), times
        clients / 4."""
        began = time.perf_counter()
        for k in range(4):
            model.load_state_dict(initial)
            local_sgd(model, train_x, train_y, params, seed=k)
        return (time.perf_counter() - began) * clients / 4

    def case(client_round, decode_round=None) -> tuple[float, float, float]:
        reference = training()
        client = timed(client_round)
        server = timed(decode_round) if decode_round is not None else 0.0
        return client, server, reference

    def codec(settings: UplinkCodec) -> tuple[float, float, float]:
        residuals: list = [None] * clients
        payloads: list = [None] * clients

        def encode_round():
            for k, delta in enumerate(deltas):
                payloads[k], _, residuals[k] = compress(settings, delta, residuals[k], generator)

        return case(encode_round, lambda: [decode(settings, payload) for payload in payloads])

    def local_dp():
        for delta in deltas:
            clipped, _ = clip_update(delta, 1.0)
            noise = gaussian_noise_like(clipped, 1.0, generator)
            {n: v + noise[n] for n, v in clipped.items()}

    def attack(kind: str) -> tuple[float, float, float]:
        return case(lambda: [attack_update(kind, d, 1.0, generator) for d in malicious])

    training()  # warm
    return {
        "attack sign_flip 20 %": attack("sign_flip"),
        "attack gaussian 20 %": attack("gaussian"),
        "privacy local, C 1, σ 1": case(local_dp),
        "compression topk 1 % + EF": codec(UplinkCodec(kind="topk", ratio=0.01, **EF)),
        "compression qsgd 127 + EF": codec(UplinkCodec(kind="qsgd", levels=127, **EF)),
        "compression sign + EF": codec(UplinkCodec(kind="sign", **EF)),
    }


def machine() -> tuple[str, str]:
    """lscpu's model name, and which of avx512 / avx512_bf16 / avx2 its flags hold."""
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = re.search(r"Model name:\s*(.+)", text)
    flags = set((re.search(r"Flags:\s*(.+)", text) or [None, ""])[1].split())
    if "avx512_bf16" in flags:
        simd = "avx512 with avx512_bf16"
    elif any(flag.startswith("avx512") for flag in flags):
        simd = "avx512, no avx512_bf16"
    else:
        simd = "avx2 only" if "avx2" in flags else "no avx2"
    return (model[1].strip() if model else platform.processor()), simd


def table(baselines, measured, maths: dict, sample_level_skipped: bool) -> str:
    """The pieces against the baselines either side; "estimate" is the added aggregation
    phase plus the clients' uplink maths alone (`uplink_maths`), against the baselines'
    median round: what the noise of the training leaves of a piece's cost (DP-SGD, whose
    cost is the training itself and far above the noise: the whole round's)."""
    totals = [b["total"] for b in baselines]
    aggregates = [b["aggregate"] for b in baselines]
    reference = statistics.median(totals)
    lines = [
        "| piece | s/round | baseline either side, s/round | added s/round | % over baseline "
        "| aggregate phase s | added to the aggregate phase s | clients' uplink maths s "
        "| estimate: added s/round (% of baseline) | outside the phases s |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| baseline (FedAvg, mean by samples) ×{len(baselines)} | "
        f"{reference:.2f} (min {min(totals):.2f}, max {max(totals):.2f}) | – | "
        f"– | – | {statistics.median(aggregates):.3f} | – | – | – | "
        f"{statistics.median(b['outside'] for b in baselines):.3f} |",
    ]
    for result in measured:
        if "error" in result:
            lines.append(f"| {result['name']} | **failed**: `{result['error']}` |" + " |" * 8)
            continue
        c = compared(baselines, result)
        client = maths.get(result["name"], (0.0, 0.0, 0.0))[0]
        estimate = c["aggregate_added"] + client
        if result["name"] == SAMPLE_LEVEL[0]:  # its cost is the training itself
            estimate = c["added"]
        lines.append(
            f"| {result['name']} | {result['total']:.2f} | {c['baseline']:.2f} | "
            f"{c['added']:+.2f} | {c['percent']:+.1f} % | {result['aggregate']:.3f} | "
            f"{c['aggregate_added']:+.3f} | "
            + (f"{client:.3f}" if result["name"] in maths else "–")
            + f" | **{estimate:+.2f} ({100 * estimate / reference:+.1f} %)** | "
            f"{result['outside']:.3f} |"
        )
    if sample_level_skipped:
        lines.append(
            f"| {SAMPLE_LEVEL[0]} | not run: `privacy.sample_level` is not wired into local "
            "training yet |" + " |" * 8
        )
    return "\n".join(lines) + "\n"


def scaling_table(rows: list[dict], d: int) -> str:
    lines = [
        "| m clients | mean: aggregate s | krum f 2: aggregate s | krum − mean s "
        "| (krum − mean) / m² ms | (krum − mean) / (m²·d) ns |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        extra = row["krum"] - row["mean"]
        lines.append(
            f"| {row['clients']} | {row['mean']:.3f} | {row['krum']:.3f} | {extra:+.3f} | "
            f"{1000 * extra / row['clients'] ** 2:.2f} | "
            f"{1e9 * extra / (row['clients'] ** 2 * d):.1f} |"
        )
    return "\n".join(lines) + f"\n\n(d = {d:,} float coordinates of cnn_mnist)\n"


def maths_table(maths: dict) -> str:
    lines = [
        "| uplink piece | clients' hosts, s per round | aggregator's decoding, s per round "
        "| a round's bare local training just before, s |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {client:.3f} | {server:.3f} | {reference:.2f} |"
        for name, (client, server, reference) in maths.items()
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-samples", type=int, default=500)
    parser.add_argument("--between", type=int, default=2, help="pieces between two baselines")
    parser.add_argument("--only", default="", help="comma-separated substrings of piece names")
    parser.add_argument("--no-scaling", action="store_true", help="skip Krum at 10, 20, 40")
    parser.add_argument("--scaling-clients", default="10,20,40")
    parser.add_argument("--scaling-max-samples", type=int, default=50)
    parser.add_argument("--scaling-rounds", type=int, default=2)
    parser.add_argument("--save", default="", help="write the figures to this JSON file")
    parser.add_argument("--record", action="store_true", help="append the result to RESULTS.md")
    args = parser.parse_args()
    args.scaling_clients = [int(n) for n in args.scaling_clients.split(",")]
    torch.manual_seed(0)

    pieces = list(PIECES)
    wired = sample_level_wired()
    if wired:
        pieces.append(SAMPLE_LEVEL)
    if args.only:
        wanted = [word.strip() for word in args.only.split(",")]
        pieces = [(n, s) for n, s in pieces if any(word in n for word in wanted)]
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-toolbox-") as folder:
        out = Path(folder)
        base = experiment(args, out)
        print("warm-up (1 round, not counted)", flush=True)
        run_once(base | {"rounds": 1, "eval_every": 1, "checkpoint_every": 1})
        print(
            f"{len(pieces)} pieces, {args.rounds} rounds a run, baseline every "
            f"{args.between} pieces",
            flush=True,
        )
        baselines, measured = interleaved(args, base, pieces)
        scaling = [] if args.no_scaling else krum_scaling(args, out)
    maths = uplink_maths(args)
    took = time.perf_counter() - began

    d = sum(p.numel() for p in build_model("cnn_mnist", (1, 28, 28), 10).parameters())
    if args.save:
        saved = {"baselines": baselines, "measured": measured, "scaling": scaling}
        Path(args.save).write_text(json.dumps(saved | {"maths": maths}, indent=1))
    text = table(baselines, measured, maths, not wired)
    if scaling:
        text += "\nKrum's aggregation phase as the cohort grows:\n\n" + scaling_table(scaling, d)
    text += "\nThe uplink's maths alone (no training around it):\n\n" + maths_table(maths)
    print()
    print(text)
    print(f"took {took / 60:.1f} min")
    if args.record:
        record(args, text, took)


def record(args, text: str, took: float) -> None:
    model, simd = machine()
    command = f"benchmarks/toolbox.py --rounds {args.rounds} --between {args.between}"
    command += f" --scaling-rounds {args.scaling_rounds}" + (
        f" --only {args.only}" if args.only else ""
    )
    section = (
        f"\n## The toolbox's cost per round (`benchmarks/toolbox.py`)\n\n"
        f"Machine: {model} ({simd}), {torch.get_num_threads()} torch threads, CPU only, "
        f"Python {platform.python_version()}, torch {torch.__version__}. Date {date.today()}. "
        f"Command: `.venv/bin/python {command}` ({took / 60:.0f} min).\n\n{text}"
    )
    RESULTS.write_text(RESULTS.read_text().rstrip("\n") + "\n" + section)


if __name__ == "__main__":
    main()
