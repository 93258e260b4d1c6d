"""The measurement behind shared.tolerances.K: every derived float32 row of `mhsa parity`, over
seeds and configs, as the K it would need (the largest gap of its row in units of the
reference's own error, floored: K x gap / tolerance). K must stay above the largest of them.

    python benchmarks/tolerance_ratios.py [SEEDS] [EPOCHS] [FIRST_SEED]   # default 5 seeds from 0, 3 epochs
    python benchmarks/tolerance_ratios.py 20 0 5      # 20 more seeds, stages, gradients and decode only
"""

import statistics
import sys
import time
from collections import defaultdict

from mhsa.parity import data_parallel
from mhsa.parity.report import build_report
from mhsa.parity.rows import FD
from mhsa.parity.runs import padding_mask
from shared.config import ModelConfig
from shared.tolerances import K

CONFIGS = {
    "default": (ModelConfig(), False),
    "default, padding": (ModelConfig(), True),
    "H=8, padding": (ModelConfig(n_heads=8), True),
    "no bias": (ModelConfig(bias=False), False),
    "V=11 D=24 H=4 T=5": (ModelConfig(vocab_size=11, d_model=24, n_heads=4, max_len=5), False),
    "V=96 D=64 H=8 T=16": (ModelConfig(vocab_size=96, d_model=64, n_heads=8, max_len=16), True),
    "H=1": (ModelConfig(n_heads=1), False),
    "V=128 D=48 H=6 T=9, no bias": (ModelConfig(vocab_size=128, d_model=48, n_heads=6, max_len=9, bias=False), True),
}


def main() -> None:
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    first = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    data_parallel.prepare(2)
    needed: dict[str, list[tuple[float, str]]] = defaultdict(list)
    by_row: dict[str, list[float]] = defaultdict(list)
    started = time.perf_counter()
    for label, (config, masked) in CONFIGS.items():
        for seed in range(first, first + seeds):
            report = build_report(config, "float32", seed, mask=padding_mask(config) if masked else None, epochs=epochs, samples=1, dp=2)
            for row in report.rows:
                if row.reference_error is None:
                    continue
                gaps = [gap for key, gap in row.diffs.items() if gap is not None and key != FD]
                needed[row.section].append((K * max(gaps) / row.tol, f"{row.name} ({label}, seed {seed})"))
                by_row[f"{row.section}: {row.name.split(',')[0]}"].append(K * max(gaps) / row.tol)
    print(f"{len(CONFIGS)} configs x {seeds} seeds from {first}, {epochs} epochs, {time.perf_counter() - started:.0f} s; K = {K:g}\n")
    print("| section | rows | median K needed | largest K needed | where |\n|---|---:|---:|---:|---|")
    for section, found in needed.items():
        worst = max(found)
        print(f"| {section} | {len(found)} | {statistics.median(value for value, _ in found):.2f} | {worst[0]:.2f} | {worst[1]} |")
    print("\n| row | comparisons | median | 90th percentile | largest |\n|---|---:|---:|---:|---:|")
    for name, values in by_row.items():
        tenth = statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]
        print(f"| {name} | {len(values)} | {statistics.median(values):.2f} | {tenth:.2f} | {max(values):.2f} |")


if __name__ == "__main__":
    main()
