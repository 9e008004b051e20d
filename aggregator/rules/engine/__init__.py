"""How the rules run: the explicit registry of every rule and the full evaluation
(`registry`), incremental evaluation (`incremental`), due times of time-dependent rules
(`duetimes`), findings kept sorted (`sortedfindings`) and the peer rules' tallies
(`peertally`). Pure.

May import: the rule families of `aggregator.rules`, `aggregator.fleet`, `proto`.
"""
