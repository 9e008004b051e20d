"""How the rules run: the tables read off the rule descriptors and the full evaluation
(`registry`), incremental evaluation (`incremental`), due times of time-dependent rules
(`duetimes`), findings kept sorted (`sortedfindings`) and the peer rules' tallies
(`peertally`). Pure.

May import: the rule families of `aggregator.rules`, `aggregator.fleet`, `proto`.
"""
