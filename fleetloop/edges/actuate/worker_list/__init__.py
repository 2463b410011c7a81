"""Routers whose only runtime lever is their worker list (vllm-router, SGLang's router): which
workers should be in (:mod:`.mapping`, pure) and the loop that keeps them there (:mod:`.actuator`).
"""
