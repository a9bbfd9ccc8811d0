"""Files built into the guest: the agent (/init) and the reseed helper's C source."""
