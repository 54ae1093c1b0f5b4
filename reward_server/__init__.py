"""The rule-reward HTTP server; reward_server.py is its entry point."""
