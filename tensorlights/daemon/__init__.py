"""What both daemons share and neither owns: /healthz bookkeeping, the metrics and health
HTTP server, and systemd's notify protocol. Imports nothing of the agent or the controller."""
