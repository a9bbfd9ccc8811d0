"""The policy pack's entry point: the Pulumi CLI runs this file (PolicyPack serves until stopped).

The rules live in warren_policy/ so tests can import them without starting the server.
"""

from pulumi_policy import EnforcementLevel, PolicyPack
from warren_policy import POLICIES

PolicyPack(name="warren-security", enforcement_level=EnforcementLevel.MANDATORY, policies=POLICIES)
