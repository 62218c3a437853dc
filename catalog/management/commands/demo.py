from django.conf import settings
from django.core.management.base import BaseCommand

from catalog.cluster import ClusterFileError
from catalog.demo import build, ensure_admin


class Command(BaseCommand):
    help = "Fill the catalog with a demo that works offline (harmless to run again)."

    def handle(self, *args, **options):
        try:
            for line in build(settings.LLMGW_MIRROR_ROOT):
                self.stdout.write(line)
        except ClusterFileError as e:
            self.stderr.write(f"the demo's cluster file: {e}")
            raise SystemExit(1) from e
        self.stdout.write(ensure_admin())
