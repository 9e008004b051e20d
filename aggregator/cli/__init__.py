"""`nicfleet-aggregator`: the command line (`main`) and its shared flag groups
(`reviewflags`, `validationflags`). Builds settings and hands them to `aggregator.service`.

May import anything in `aggregator` and `proto`.
"""
