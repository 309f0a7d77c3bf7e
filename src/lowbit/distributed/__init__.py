"""lowbit beyond one machine, on Ray (the extra lowbit[ray]); Ray is the engine: lowbit writes no
scheduler, router or RPC of its own.

cluster.py   joins a Ray cluster or starts a local one (loopback only) and stops what it started
pipeline.py  a model as a pipeline of K Ray actors, each holding a contiguous range of layers
             (lowbit.load(path, stages=K), lowbit serve --ray --stages K)

Replicas behind Ray Serve are lowbit/server/ray_serve.py.
"""
from .cluster import Cluster, RayMissing, import_ray

__all__ = ["Cluster", "RayMissing", "import_ray"]
