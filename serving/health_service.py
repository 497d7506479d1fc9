"""The standard health service (``grpc.health.v1``, grpcio-health-checking's asyncio servicer) with one change: when
the server drains, a ``Watch`` stream ends once it has told its client the last status (NOT_SERVING).

The library's ``Watch`` waits for the next status change forever, so every open watcher (what Kubernetes-style
probes and load balancers keep) held a draining server until its whole shutdown grace ran out, and an engine process
that died took the server that long to exit. Here the drain waits for accepted calls only: a watcher is told
NOT_SERVING and its stream ends with OK, as an Envoy or a client library expects of a server going away."""

from __future__ import annotations

from grpc_health.v1 import health, health_pb2

UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class DrainingHealthServicer(health.aio.HealthServicer):
    async def Watch(self, request: health_pb2.HealthCheckRequest, context) -> None:
        # The library's loop (the same bookkeeping of its conditions and watcher counts), which ends after the drain's
        # status is sent instead of waiting for a change that never comes.
        service = request.service
        condition = self._server_watchers[service]
        self._watcher_count_by_service[service] += 1
        last = None
        try:
            async with condition:
                while True:
                    status = self._server_status.get(service, UNKNOWN)
                    if status != last:
                        await context.write(health_pb2.HealthCheckResponse(status=status))
                    last = status
                    if self._gracefully_shutting_down:
                        return
                    await condition.wait()
        finally:
            self._watcher_count_by_service[service] -= 1
            if self._watcher_count_by_service[service] == 0:
                del self._server_watchers[service]
                del self._watcher_count_by_service[service]

    async def enter_graceful_shutdown(self) -> None:
        """NOT_SERVING for every service from now on, and every watcher woken to say so and end (those of services
        never set too, which the library leaves waiting)."""
        await super().enter_graceful_shutdown()
        for condition in list(self._server_watchers.values()):
            async with condition:
                condition.notify_all()
