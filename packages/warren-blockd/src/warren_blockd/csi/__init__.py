"""warren-blockd's CSI node plugin (driver `blockd.warren.dev`): pods name a workspace in an
inline ephemeral volume; the plugin has the local daemon mount it and binds it into the pod.

  attributes.py  what a pod may ask for (volumeAttributes) and how it is checked
  publisher.py   publish and unpublish against the local daemon
  mounts.py      /proc/self/mountinfo and bind mounts
  records.py     what is published where, on node disk (survives a plugin restart)
  services.py    the gRPC services: CSI Identity and Node, kubelet plugin registration
  server.py      the process: both sockets, signals, registration outcome
"""

from __future__ import annotations

DRIVER_NAME = "blockd.warren.dev"
