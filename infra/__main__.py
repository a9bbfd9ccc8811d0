"""Warren's Pulumi program: read the stack's settings once, then deploy its target."""

import environments
import stack_settings

environments.deploy(stack_settings.load())
