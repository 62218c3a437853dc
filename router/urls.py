from django.urls import path

from . import views

app_name = "router"

urlpatterns = [
    path("chat/completions", views.chat_completions, name="chat_completions"),
    path("completions", views.completions, name="completions"),
    path("models", views.models, name="models"),
]
