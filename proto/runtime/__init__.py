"""Runtime helpers both processes share, outside the wire contract: logging
(`logs`), NATS credentials and TLS (`natsconnect`, `natsflags`) and an ordered flush
(`natsflush`). They may import click, nats-py and nkeys; the wire modules of `proto` never
import this package.
"""
