"""The daemon as a service operators run: health and readiness, metrics, task supervision,
Kafka client security, settings from the environment, the HTTP face (``/healthz``, ``/readyz``,
``/metrics``). Shell code: it reads the daemon's state, never decides anything.
"""
