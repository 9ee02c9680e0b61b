"""The benchmark: scenarios of synthetic PS jobs on an emulated cluster, run under each policy
side by side, with the lower bound on average JCT and a Markdown/PNG report.

    python -m tensorlights.bench run --reps 3 --out results/bench
"""
