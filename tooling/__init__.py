"""What the nox sessions run besides the tiers: the environments (nox_envs, nox_builds), the wheel check."""
