"""The companion's Kubernetes edge, one module per job:

- `client`: the plumbing (API groups, timeouts, retries, `KubeError`, `KubeSettings`, `API_ACCESS`)
- `aggregate`: pure sums of what was listed (GPUs per NodePool, placeholders, pods' workloads)
- `reads`: the cluster read into a `ClusterView`
- `lease`: leader election on a Lease
- `writes`: NodePool patches, placeholder Deployments, pod deletion costs
- `events`: a Kubernetes Event per change
- `cluster`: `Kube`, all of the above on one client
"""

# Imported from here by gpu_queue_scaler.cli's companion sub-command.
from gpu_queue_scaler.companion.kube.client import KubeSettings

__all__ = ["KubeSettings"]
