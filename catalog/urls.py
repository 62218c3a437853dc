from django.urls import path

from . import views

app_name = "catalog"
urlpatterns = [
    path("", views.model_list, name="model_list"),
    path("models/<str:name>/", views.model_detail, name="model_detail"),
    path("models/<str:name>/context/", views.context_change, name="context_change"),
    path("models/<str:name>/context/preview/", views.context_preview, name="context_preview"),
    path("changes/", views.change_list, name="change_list"),
    path("changes/<int:pk>/", views.change_detail, name="change_detail"),
    path("changes/<int:pk>/rollback/", views.change_rollback, name="change_rollback"),
    path("replicas/<int:pk>/log/", views.replica_log, name="replica_log"),
]
