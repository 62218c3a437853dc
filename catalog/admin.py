"""Django admin: the catalog's raw data, and the audit history (read-only).

A model's context, longest answer and its profiles' context flags are not edited here
as plain fields: they change only through the service (`services.request_change`),
which checks the plan, records the change and restarts the replicas. Declared models
are read-only: the cluster file is their source of truth."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from .domain.args import get_arg
from .domain.plan import CONTEXT_FLAGS
from .models import Change, ChangeStep, GPUClass, Model, Node, OriginFile, Profile, Replica


class DeclaredReadOnly:
    """Objects of a declared model cannot be changed or deleted here."""

    def _declared(self, obj) -> bool:
        model = obj if isinstance(obj, Model) else getattr(obj, "model", None)
        return bool(model and model.declared)

    def has_change_permission(self, request, obj=None):
        if obj is not None and self._declared(obj):
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        if obj is not None and self._declared(obj):
            return False
        return super().has_delete_permission(request, obj)


@admin.register(GPUClass)
class GPUClassAdmin(admin.ModelAdmin):
    list_display = ["name", "memory_gb", "usable_gb", "source"]
    search_fields = ["name"]


class DeclaredInlineReadOnly:
    """An inline of a declared model's page: shown, not editable (obj is the model)."""

    def has_change_permission(self, request, obj=None):
        return not (obj and obj.declared) and super().has_change_permission(request, obj)

    def has_add_permission(self, request, obj=None):
        return not (obj and obj.declared) and super().has_add_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return not (obj and obj.declared) and super().has_delete_permission(request, obj)


class OriginFileInline(DeclaredInlineReadOnly, admin.TabularInline):
    model = OriginFile
    extra = 0



class ProfileForm(forms.ModelForm):
    class Meta:
        model = Profile
        fields = "__all__"

    def clean(self):
        data = super().clean()
        args = data.get("args")
        if args is not None and (not isinstance(args, list) or not all(isinstance(a, str) for a in args)):
            raise ValidationError({"args": "a list of strings, exactly as the engine gets them"})
        if self.instance.pk and args is not None:
            engine = self.instance.engine
            for names in CONTEXT_FLAGS.get(engine, ()):
                if get_arg(self.instance.args, *names) != get_arg(args, *names):
                    raise ValidationError(
                        {"args": f"{names[0]} is the context: change it with the model's “Context length…” action, "
                                 "which checks the memory and restarts the replicas"}
                    )
        if self.instance.pk and data.get("engine") and data["engine"] != self.instance.engine:
            raise ValidationError({"engine": "a profile's engine cannot change: add a new profile"})
        return data


class ProfileInline(DeclaredInlineReadOnly, admin.StackedInline):
    model = Profile
    form = ProfileForm
    extra = 0
    show_change_link = True



class ContextForm(forms.Form):
    tokens = forms.IntegerField(min_value=0, max_value=10**8, required=False, help_text="tokens one request may use; empty: change only the longest answer")
    slots = forms.IntegerField(min_value=0, max_value=64, required=False, help_text="llama.cpp: requests at once; empty keeps --parallel")
    max_output = forms.IntegerField(min_value=0, max_value=10**8, required=False, label="Longest answer")
    message = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), help_text="why (kept in the audit)")


@admin.register(Model)
class ModelAdmin(DeclaredReadOnly, admin.ModelAdmin):
    list_display = ["name", "source_or_origin", "context_length", "max_output", "declared"]
    list_filter = ["declared"]
    search_fields = ["name", "source", "origin_repo"]
    readonly_fields = ["context_length", "max_output", "declared", "shape", "shape_error", "shape_read_at", "context_action"]
    inlines = [OriginFileInline, ProfileInline]

    @admin.display(description="source")
    def source_or_origin(self, obj):
        return obj.source or obj.origin_repo

    @admin.display(description="context")
    def context_action(self, obj):
        if not obj.pk:
            return "set once the model exists"
        if obj.declared:
            return "declared in the cluster's settings: change its context there"
        return format_html('<a class="button" href="{}">Context length…</a>', reverse("admin:catalog_model_context", args=[obj.pk]))

    def get_urls(self):
        return [
            path("<int:pk>/context/", self.admin_site.admin_view(self.context_view), name="catalog_model_context"),
            *super().get_urls(),
        ]

    def context_view(self, request, pk):
        from . import services

        model = get_object_or_404(Model, pk=pk)
        form = ContextForm(request.POST or None)
        plan = None
        if request.method == "POST" and form.is_valid():
            values = {k: form.cleaned_data[k] or 0 for k in ("tokens", "slots", "max_output")}
            try:
                change = services.request_change(model.name, **values, message=form.cleaned_data["message"],
                                                 user=request.user, source="admin")
            except services.ServiceError as e:
                plan = getattr(e, "plan", None)
                form.add_error(e.field if e.field in form.fields else None, str(e))
            else:
                messages.success(request, f"Change {change.pk} of {model.name}: {change.get_state_display()}.")
                return redirect(change.get_absolute_url())
        context = {**self.admin_site.each_context(request), "opts": self.opts, "original": model, "form": form,
                   "plan": plan, "title": f"Context length of {model.name}"}
        return TemplateResponse(request, "admin/catalog/model/context.html", context)


@admin.register(Profile)
class ProfileAdmin(DeclaredReadOnly, admin.ModelAdmin):
    form = ProfileForm
    list_display = ["__str__", "engine", "gpu_class", "cpu_only", "tp", "pp", "nodes"]
    list_filter = ["engine", "cpu_only", "gpu_class"]
    search_fields = ["name", "model__name"]
    list_select_related = ["model", "gpu_class"]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "host", "gpu_class", "gpu_count", "ram_gb", "backend"]


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = ["__str__", "state", "endpoint", "pid", "started_at"]
    list_filter = ["state", "node"]
    list_select_related = ["profile__model", "node"]
    readonly_fields = [f.name for f in Replica._meta.fields]

    def has_add_permission(self, request):
        return False  # the fleet starts replicas


class ChangeStepInline(admin.TabularInline):
    model = ChangeStep
    extra = 0
    can_delete = False
    readonly_fields = [f.name for f in ChangeStep._meta.fields]

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Change)
class ChangeAdmin(admin.ModelAdmin):
    """The audit history: read-only."""

    list_display = ["id", "model", "kind", "state", "user", "source", "created_at", "message"]
    list_filter = ["state", "kind", "source", "model"]
    search_fields = ["model__name", "message", "user__username"]
    list_select_related = ["model", "user"]
    readonly_fields = [f.name for f in Change._meta.fields]
    inlines = [ChangeStepInline]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
