import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_console.settings")
django_application = get_asgi_application()

# The router's /v1/ is answered before Django's handler (router/asgi.py says why).
from router.asgi import RouterDispatch  # noqa: E402  (needs the settings above)

application = RouterDispatch(django_application)
