"""The demo fleet on this machine.

    manage.py fleet up [--replicas MODEL[/PROFILE]=N ...] [--default-replicas N] [--timeout S]
    manage.py fleet status
    manage.py fleet down
    manage.py fleet reconcile

`up` gives each non-declared profile whose engine can run here (llama.cpp, a stand-in, or
an engine with a configured command) N replicas in all (N from --replicas, else
--default-replicas, 1), spread over this machine's nodes of the profile's kind (its GPU
class and cards, or no cards for a CPU-only profile), starts the missing ones, waits until
they are ready and prints their endpoints. `down` stops every replica that runs."""

from __future__ import annotations

import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from catalog import fleet
from catalog.choices import ReplicaState
from catalog.fleet import engines
from catalog.models import Node, Profile, Replica
from catalog.rollout import args_hash

ACTIVE = (ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING)


def runs_here(engine: str) -> bool:
    return engine == "llamacpp" or engines.uses_standin(engine) or engine in (settings.LLMGW_ENGINE_COMMANDS or {})


def cards_per_node(profile: Profile) -> int:
    return max(profile.gpus_per_node, profile.tp, 1)


def placement(profile: Profile) -> str:
    if profile.cpu_only or profile.gpu_class_id is None:
        return "CPU only"
    return f"{cards_per_node(profile)} x {profile.gpu_class.name}"


def fits(profile: Profile, node: Node) -> bool:
    """Whether a node is of the profile's kind: CPU-only profiles go on nodes without cards
    (or any node, if none is without), GPU profiles on nodes of their class with enough cards."""
    if profile.cpu_only or profile.gpu_class_id is None:
        return node.gpu_count == 0 or not Node.objects.filter(gpu_count=0).exists()
    return node.gpu_class_id == profile.gpu_class_id and node.gpu_count >= cards_per_node(profile)


class Command(BaseCommand):
    help = "Start, show, stop and reconcile the engine replicas of this machine's fleet."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        up = sub.add_parser("up", help="start the replicas the catalog wants and wait until ready")
        up.add_argument("--replicas", action="append", default=[], metavar="MODEL[/PROFILE]=N")
        up.add_argument("--default-replicas", type=int, default=1)
        up.add_argument("--timeout", type=float, default=None, help="seconds to wait for each replica")
        sub.add_parser("status", help="the replicas and whether their processes run")
        sub.add_parser("down", help="stop every running replica")
        sub.add_parser("reconcile", help="compare the database with what runs, and fix it")

    def handle(self, *args, action, **opts):
        getattr(self, f"do_{action}")(**opts)

    # --- up --------------------------------------------------------------------------
    def _counts(self, specs: list[str]) -> dict[str, int]:
        counts = {}
        for spec in specs:
            key, sep, n = spec.partition("=")
            if not sep or not n.strip().isdigit():
                raise CommandError(f"--replicas {spec!r}: expected MODEL[/PROFILE]=N")
            counts[key.strip()] = int(n)
        return counts

    def do_up(self, replicas, default_replicas, timeout, **_):
        counts = self._counts(replicas)
        # this machine's nodes: those whose engines listen on a loopback address
        nodes = list(Node.objects.filter(host__in=["127.0.0.1", "localhost", "::1"]))
        if not nodes:
            backend = settings.LLMGW_FLEET_BACKEND if settings.LLMGW_FLEET_BACKEND in ("local", "celery") else "local"
            nodes = [Node.objects.create(name="local", host="127.0.0.1", backend=backend)]
            self.stdout.write(f"created node 'local' (this machine, backend {backend}"
                              + (": a worker must consume queue node.local)" if backend == "celery" else ")"))
        started: list[Replica] = []
        for profile in Profile.objects.select_related("model", "gpu_class").filter(model__declared=False):
            if not runs_here(profile.engine):
                self.stdout.write(f"{profile}: {profile.engine} cannot run on this machine; skipped")
                continue
            want = counts.get(f"{profile.model.name}/{profile.name}", counts.get(profile.model.name, default_replicas))
            fitting = [n for n in nodes if fits(profile, n)]
            if want and not fitting:
                self.stdout.write(f"{profile}: no node here of its kind ({placement(profile)}); skipped")
                continue
            running = list(Replica.objects.filter(profile=profile, state__in=ACTIVE).values_list("node_id", "slot"))
            used = {slot for _, slot in running}
            free = (s for s in range(10_000) if s not in used)
            # N replicas of the profile in all, spread over the nodes that fit it.
            for i in range(max(0, want - len(running))):
                node = fitting[(len(running) + i) % len(fitting)]
                try:
                    started.append(fleet.start_replica(profile, node, list(profile.args), slot=next(free)))
                except fleet.EngineFailed as e:
                    self.stderr.write(f"{profile} on {node}: {e}")
        failed = 0
        for replica in started:
            try:
                seconds = fleet.wait_ready(replica, timeout)
            except fleet.EngineFailed as e:
                fleet.stop(replica, ReplicaState.FAILED)
                fleet.mark(replica, ReplicaState.FAILED, error=str(e))
                self.stderr.write(f"{replica.profile} #{replica.slot}: failed: {e}")
                failed += 1
                continue
            fleet.mark(replica, ReplicaState.READY)
            self.stdout.write(f"{replica.profile} #{replica.slot} on {replica.node}: ready in {seconds:.1f} s at {replica.endpoint}")
        self.do_status()
        if failed:
            raise CommandError(f"{failed} replica(s) failed to start")

    # --- status, down, reconcile ----------------------------------------------------------
    def do_status(self, **_):
        rows = Replica.objects.filter(state__in=ACTIVE).select_related("profile__model", "node").order_by("profile", "node", "slot")
        if not rows:
            self.stdout.write("no replicas running")
            return
        self.stdout.write(f"{'id':>5}  {'model/profile':30} {'node':10} {'slot':>4}  {'state':9} {'pid':>7} {'alive':5}  {'args':16}  endpoint")
        for r in rows:
            try:
                up = "yes" if fleet.alive(r) else "NO"
            except fleet.EngineFailed:
                up = "?"
            self.stdout.write(f"{r.id:>5}  {str(r.profile):30} {r.node.name:10} {r.slot:>4}  {r.state:9} {r.pid or '-':>7} "
                              f"{up:5}  {args_hash(r.args):16}  {r.endpoint}")

    def do_down(self, **_):
        rows = list(Replica.objects.filter(state__in=ACTIVE).select_related("profile__model", "node"))
        for r in rows:
            fleet.stop(r)
            self.stdout.write(f"stopped {r.profile} #{r.slot} on {r.node} (pid {r.pid})")
        self.stdout.write(f"{len(rows)} replica(s) stopped")

    def do_reconcile(self, **_):
        began = time.monotonic()
        msgs = fleet.reconcile()
        for m in msgs:
            self.stdout.write(m)
        self.stdout.write(f"reconciled in {time.monotonic() - began:.1f} s: {len(msgs)} finding(s)")
