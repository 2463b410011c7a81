"""fleetloop inside LiteLLM: its pick for LiteLLM's Router, and every call's outcome to ``fleet.requests``.

One ``CustomLogger`` (:class:`~fleetloop.edges.litellm.handler.FleetloopCallback`) does both, in the
LiteLLM Router SDK and in LiteLLM's proxy alike:

- **Pick**: its ``async_filter_deployments`` hook. LiteLLM's Router calls it on every async call
  with the deployments it still considers (its own cooldowns, and on a retry the deployments that
  failed, already left out) before its routing strategy chooses; fleetloop's router
  (:mod:`fleetloop.router`: weights, by-priority weights, breakers, shed thresholds, retry budget,
  prefix affinity, fail static, never empty) picks a node among them and the hook keeps only that
  node's deployments, so any ``routing_strategy`` sends the call there. A shed call keeps none:
  LiteLLM answers 429.
- **Outcomes**: its ``async_log_success_event`` (TTFT from LiteLLM's first-chunk time for a streamed
  call, tokens from its usage), and ``async_post_call_failure_deployment_hook``, which LiteLLM calls
  once per failed attempt on a deployment, its own retries included, so each node's failures are
  each counted against it; a shed is published by the pick, with no node.

Why this extension point: in LiteLLM 1.110 the custom routing strategy
(``Router.set_custom_routing_strategy``, now ``register_plugin``) is an SDK-only call that replaces
LiteLLM's choice without its cooldowns, and the proxy's ``config.yaml`` has no key that loads one;
its ``router_settings.plugins`` (``RoutingPlugin``) narrow a call's candidates by provider model
name (``litellm_params.model``), which many deployments of one model share, so they cannot name a
node. A callback is what the proxy loads by module path (``litellm_settings.callbacks``), and
``async_filter_deployments`` sees each deployment.

LiteLLM's synchronous calls (SDK ``Router.completion``) run no deployment filter: the one sync hook
that chooses is a custom routing strategy's ``get_available_deployment``. For them the SDK user
also registers :meth:`~fleetloop.edges.litellm.handler.FleetloopCallback.strategy`, which picks
among the deployments not in LiteLLM's cooldown exactly as the filter does (a shed: LiteLLM's 429),
and the callback's sync logging hooks (``log_success_event``, ``log_failure_event`` per failed
attempt) publish their outcomes without waiting for Kafka (the clients run in a loop on a thread of
their own when the caller has none). ``docs/integrations/routers.md`` has the table of paths.

Use:

- **Proxy**: ``litellm_settings: {callbacks: ["fleetloop.edges.litellm.proxy.handler"]}`` in its
  ``config.yaml``, ``FLEETLOOP_BOOTSTRAP_SERVERS`` in its environment (``examples/litellm/``).
- **SDK**: ``cb = FleetloopCallback(BOOTSTRAP)``; ``litellm.callbacks.append(cb)``; call
  ``router.acompletion(..., metadata={"fleetloop": {"task": ..., "priority": ...}})``; ``await
  cb.stop()`` at shutdown flushes the outcomes queued. Sync calls: also
  ``router.register_plugin(cb.strategy(router))`` and ``cb.close()`` at shutdown.
- Deployments map to nodes and pools by ``model_info`` (``fleetloop_node``, ``fleetloop_pool``) or
  a deployment map (:mod:`fleetloop.edges.litellm.mapping`); :mod:`fleetloop.edges.litellm.launch`
  starts a proxy on loopback for a bench arm.

Set ``LITELLM_LOCAL_MODEL_COST_MAP=True`` where LiteLLM must not fetch its price map at import.
"""
