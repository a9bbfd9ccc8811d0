"""The option every warren.platform module shares, documented once."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  warren:
    description: The warren command (a path, or a name found on C(PATH)).
    type: str
    default: warren
"""
