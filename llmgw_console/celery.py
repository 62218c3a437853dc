import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_console.settings")

app = Celery("llmgw_console")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
