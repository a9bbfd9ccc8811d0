"""warren-control: the control plane (edge, API, controller, status mirror, reaper)."""

__version__ = "0.1.0"
