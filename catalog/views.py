from django.http import HttpResponse
from django.shortcuts import get_object_or_404

from .models import Change, Model


def model_list(request):
    return HttpResponse("models")


def model_detail(request, name):
    get_object_or_404(Model, name=name)
    return HttpResponse(name)


def change_detail(request, pk):
    get_object_or_404(Change, pk=pk)
    return HttpResponse(str(pk))
