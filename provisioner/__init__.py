"""provisioner: tune bare-metal CPU servers for machine learning, and prove it."""

__version__ = "0.1.0"
