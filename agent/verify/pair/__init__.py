"""The pair test between two pods: the serve/peer sides (`sides`), the out-of-band
handshake (`handshake`), the RC queue pair (`queuepair`), perftest's tables (`perftest`) and
the result math (`results`).

May import: `agent.host`, `agent.errors`, `proto`.
"""
