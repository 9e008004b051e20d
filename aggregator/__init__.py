"""nicfleet aggregator: the fleet view, rules, alerts and the HTTP API."""

__version__ = "0.1.0"
