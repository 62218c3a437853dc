from django.urls import path

from . import views

app_name = "catalog"
urlpatterns = [
    path("", views.model_list, name="model_list"),
    path("models/<str:name>/", views.model_detail, name="model_detail"),
    path("changes/<int:pk>/", views.change_detail, name="change_detail"),
]
