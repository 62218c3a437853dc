"""python manage.py create_api_token USERNAME: print the user's API token (made when it has none).

The CLI takes it from LLMGW_TOKEN; the API reads it from `Authorization: Token <token>`."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from rest_framework.authtoken.models import Token


class Command(BaseCommand):
    help = "Print USERNAME's API token for the REST API and the llmgw CLI, creating it when missing."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--rotate", action="store_true", help="replace an existing token with a new one")

    def handle(self, *args, username, rotate=False, **options):
        User = get_user_model()
        try:
            user = User.objects.get(**{User.USERNAME_FIELD: username})
        except User.DoesNotExist:
            raise CommandError(f"no user {username!r}") from None
        if not user.is_active:
            raise CommandError(f"user {username!r} is not active")
        if rotate:
            Token.objects.filter(user=user).delete()
        token, _ = Token.objects.get_or_create(user=user)
        self.stdout.write(token.key)
