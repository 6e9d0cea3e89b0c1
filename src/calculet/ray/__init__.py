"""Calculet on a Ray Serve cluster (the optional `ray` extra): model replicas behind one OpenAI endpoint.

Only `calculet ray ...` and users who import `calculet.ray.deployment` load Ray; `calculet serve`
never does. `options.py` and `bridge.py` import no Ray, so flags are checked without a cluster.
"""
