"""`python manage.py create_api_key NAME [--models a,b]`: a key for the router, printed once."""

from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError, transaction

from catalog.models import Model
from router.models import ApiKey


class Command(BaseCommand):
    help = "Create an API key for the OpenAI-compatible router; the key is printed once and only its hash is kept."

    def add_arguments(self, parser):
        parser.add_argument("name", help="a unique name for the key (who or what uses it)")
        parser.add_argument("--models", default="", help="comma-separated model names it may use (default: every model)")

    def handle(self, *args, name, models, **options):
        name = name.strip()
        if not name:
            raise CommandError("the key needs a name")
        wanted = sorted({m.strip() for m in models.split(",") if m.strip()})
        found = list(Model.objects.filter(name__in=wanted))
        missing = sorted(set(wanted) - {m.name for m in found})
        if missing:
            raise CommandError(f"no such model: {', '.join(missing)}")
        try:
            with transaction.atomic():
                api_key, key = ApiKey.issue(name)
                api_key.models.set(found)
        except IntegrityError:
            raise CommandError(f"a key named {name!r} exists already") from None
        scope = ", ".join(wanted) if wanted else "every model"
        self.stderr.write(f"API key {name!r} created for {scope}. It is shown once; keep it now:")
        self.stdout.write(key)
