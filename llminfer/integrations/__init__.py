"""Integrations of llminfer with other systems, each an optional extra:

- ``llminfer.integrations.ray_serve`` (``pip install "llminfer[ray]"``):
  llminfer servers as Ray Serve replicas behind a prefix-aware router.
"""
