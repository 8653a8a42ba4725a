"""A/B runs: two commits' benchmark figures, measured alternately in one sitting.

Every change to a hot path is measured against the last landed commit in the same sitting:
this machine's speed drifts by up to 2× between hours, so figures from different hours do
not compare. ``scripts/ab`` (``python -m hark.bench.ab``) builds each commit once in a git
worktree and environment of its own under ``.ab/`` (``builds``), runs the chosen benches
against A and B alternately, each run on a fresh ``hark serve`` of that commit (``runs``,
``benches``), and prints each figure's rounds, medians and B/A, flagging a figure more than
10 % worse (``table``). docs/performance.md, "A/B: comparing two commits", says how to read it.
"""
