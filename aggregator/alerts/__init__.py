"""Alerts: the lifecycle of findings (pure), their persistence and their delivery."""
