"""The callback instance LiteLLM's proxy loads by name: in its ``config.yaml``,

```yaml
litellm_settings:
  callbacks: ["fleetloop.edges.litellm.proxy.handler"]
```

with ``FLEETLOOP_BOOTSTRAP_SERVERS`` (and the other settings of
:meth:`~fleetloop.edges.litellm.handler.FleetloopCallback.from_env`) in the proxy's environment.
Imported by the proxy while it reads its config: a bad setting stops it there, naming the setting.
"""

from __future__ import annotations

from fleetloop.edges.litellm.handler import FleetloopCallback

handler = FleetloopCallback.from_env()
