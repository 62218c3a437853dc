from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from catalog.cluster import ClusterFileError, load


class Command(BaseCommand):
    help = "Load the models declared in the cluster's TOML file (LLMGW_CLUSTER_FILE) into the catalog."

    def add_arguments(self, parser):
        parser.add_argument("path", nargs="?", help="the cluster file (default: LLMGW_CLUSTER_FILE)")

    def handle(self, *args, path=None, **options):
        path = path or settings.LLMGW_CLUSTER_FILE
        if not path:
            raise CommandError("no cluster file: pass a path or set LLMGW_CLUSTER_FILE")
        try:
            result = load(path)
        except ClusterFileError as e:
            raise CommandError(f"{e} (nothing was changed)") from e
        for label, names in (("created", result.created), ("updated", result.updated),
                             ("unchanged", result.unchanged), ("no longer declared", result.undeclared)):
            if names:
                self.stdout.write(f"{label}: {', '.join(names)}")
        if not (result.created or result.updated or result.unchanged or result.undeclared):
            self.stdout.write("the cluster file declares no models")
