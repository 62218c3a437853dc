"""/api/v1/… — authentication is DRF's (token or session), so Django's LoginRequiredMiddleware
steps aside for these views: they answer 401/403 in JSON rather than redirecting to a form."""

from django.contrib.auth.decorators import login_not_required
from django.urls import path

from . import views

app_name = "api"


def _view(cls):
    return login_not_required(cls.as_view())


urlpatterns = [
    path("models", _view(views.ModelList), name="model-list"),
    path("models/<str:name>", _view(views.ModelDetail), name="model-detail"),
    path("models/<str:name>/context", _view(views.ModelContext), name="model-context"),
    path("changes/<int:pk>", _view(views.ChangeDetail), name="change-detail"),
    path("changes/<int:pk>/rollback", _view(views.ChangeRollback), name="change-rollback"),
    path("replicas/<int:pk>/log", _view(views.ReplicaLog), name="replica-log"),
]
