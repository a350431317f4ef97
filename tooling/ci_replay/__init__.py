"""Replays the hosted jobs of gate.yml and moegate.yml with act, as a runner would run them (README.md here)."""
