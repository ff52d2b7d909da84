"""Leader election on a coordination.k8s.io/v1 Lease: only the leader writes, and never past the
Lease it holds. On shutdown it gives the Lease up (holderIdentity null) so a standby takes over at
its next pass instead of after the lease duration. In dry-run the Lease is not written either.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpu_queue_scaler.companion.kube.aggregate import as_dict
from gpu_queue_scaler.companion.kube.client import KubeClient, KubeError, as_json, describe, log


def micro_time(at: float) -> str:
    """A Lease MicroTime (RFC 3339, microseconds, UTC). A whole second gets 1 µs: newer clients
    re-serialise it with isoformat(), which drops a zero fraction, and the API server's MicroTime
    parser requires one."""
    stamp = datetime.fromtimestamp(at, UTC)
    if stamp.microsecond == 0:
        stamp = stamp.replace(microsecond=1)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: object) -> float | None:
    """An RFC 3339 time as written by any client (Z or offset, with or without fraction)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class Leader(KubeClient):
    """The Lease of one companion: `elect` each pass, `_guard` before each write, `release` on
    shutdown. `*_sync` block; the async ones run them in a worker thread."""

    _leader_until = 0.0  # wall clock until which our Lease is known to be ours

    def _guard(self) -> None:
        """Never write past the Lease: a pass slower than the lease must not race a successor."""
        if not self.settings.dry_run and self._clock() >= self._leader_until:
            raise KubeError("not the leader (or the Lease expired during this pass): not writing")

    def elect_sync(self, now: float) -> bool:
        """Acquire or renew the Lease; True while we lead. Optimistic concurrency: every update
        carries the resourceVersion read, so of two racing companions one gets 409 and follows."""
        from kubernetes.client.exceptions import ApiException

        s = self.settings
        what = f"Lease {s.namespace}/{s.lease_name}"
        timeout = s.request_timeout_s
        try:
            response = self._coordination.read_namespaced_lease(
                s.lease_name, s.namespace, _preload_content=False, _request_timeout=timeout
            )
            lease: dict[str, Any] | None = as_json(response)
        except ApiException as exc:
            if exc.status != 404:
                self._leader_until = 0.0
                raise describe(f"reading {what}", exc) from None
            lease = None
        except Exception as exc:
            self._leader_until = 0.0
            raise describe(f"reading {what}", exc) from None

        spec = as_dict((lease or {}).get("spec"))
        holder = spec.get("holderIdentity")
        duration = spec.get("leaseDurationSeconds")
        renewed = parse_time(spec.get("renewTime"))
        expired = (
            not holder
            or renewed is None
            or not isinstance(duration, int)
            or renewed + duration < now
        )
        if lease is not None and holder != s.identity and not expired:
            self._leader_until = 0.0
            return False

        mine = holder == s.identity
        acquired = spec.get("acquireTime") if mine and spec.get("acquireTime") else micro_time(now)
        transitions = int(spec.get("leaseTransitions") or 0)
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": s.lease_name, "namespace": s.namespace},
            "spec": {
                "holderIdentity": s.identity,
                "leaseDurationSeconds": s.lease_duration_s,
                "acquireTime": acquired,
                "renewTime": micro_time(now),
                "leaseTransitions": transitions + (0 if mine or lease is None else 1),
            },
        }
        try:
            if lease is None:
                self._coordination.create_namespaced_lease(
                    s.namespace, body, _request_timeout=timeout
                )
            else:
                meta = as_dict(lease.get("metadata"))
                body["metadata"]["resourceVersion"] = meta.get("resourceVersion")
                self._coordination.replace_namespaced_lease(
                    s.lease_name, s.namespace, body, _request_timeout=timeout
                )
        except ApiException as exc:
            self._leader_until = 0.0
            if exc.status == 409:  # another companion wrote it first: it leads
                return False
            raise describe(f"writing {what}", exc) from None
        except Exception as exc:
            self._leader_until = 0.0
            raise describe(f"writing {what}", exc) from None
        if holder != s.identity:
            log.info("leading", extra={"event": "lease_acquired", "lease": what})
        self._leader_until = now + s.lease_duration_s
        return True

    async def elect(self, now: float) -> bool:
        import asyncio

        return await asyncio.to_thread(self.elect_sync, now)

    def release_sync(self, now: float) -> bool:
        """Give the Lease up if we hold it: holderIdentity null (an empty holder is expired to
        every companion), so a standby takes over at its next pass instead of after
        leaseDurationSeconds. True when released; never raises (shutdown must go on), and does
        nothing in dry-run or when another holds it (a 409 means someone else wrote it)."""
        from kubernetes.client.exceptions import ApiException

        s = self.settings
        self._leader_until = 0.0
        if s.dry_run:
            return False
        what = f"Lease {s.namespace}/{s.lease_name}"
        timeout = s.request_timeout_s
        try:
            response = self._coordination.read_namespaced_lease(
                s.lease_name, s.namespace, _preload_content=False, _request_timeout=timeout
            )
            lease = as_json(response)
            spec = as_dict(lease.get("spec"))
            if spec.get("holderIdentity") != s.identity:
                return False
            released: dict[str, Any] = {
                "leaseDurationSeconds": spec.get("leaseDurationSeconds") or s.lease_duration_s,
                "renewTime": micro_time(now),
                "leaseTransitions": int(spec.get("leaseTransitions") or 0),
            }
            if spec.get("acquireTime"):
                released["acquireTime"] = spec["acquireTime"]
            meta = as_dict(lease.get("metadata"))
            body: dict[str, Any] = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": s.lease_name,
                    "namespace": s.namespace,
                    "resourceVersion": meta.get("resourceVersion"),
                },
                "spec": released,  # no holderIdentity: released
            }
            self._coordination.replace_namespaced_lease(
                s.lease_name, s.namespace, body, _request_timeout=timeout
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                log.warning(
                    "%s", describe(f"releasing {what}", exc), extra={"event": "lease_error"}
                )
            return False
        except Exception as exc:
            log.warning("%s", describe(f"releasing {what}", exc), extra={"event": "lease_error"})
            return False
        log.info("released the Lease", extra={"event": "lease_released", "lease": what})
        return True

    async def release(self, now: float) -> bool:
        import asyncio

        return await asyncio.to_thread(self.release_sync, now)
