"""`Kube`, the one handle the companion's run loop holds on the cluster: the reads, the Lease, the
writes and their Events on one API client.
"""

from __future__ import annotations

from gpu_queue_scaler.companion.kube.reads import Reads
from gpu_queue_scaler.companion.kube.writes import Writes


class Kube(Reads, Writes):
    """Reads and writes for one companion. Methods named `*_sync` block; the async ones run
    them in a worker thread."""
