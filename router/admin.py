import secrets

from django.contrib import admin, messages

from .models import KEY_PREFIX, ApiKey, hash_key


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys are issued here (the key itself is shown once, in a message) and revoked by
    unticking `active`; only the hash is stored, so a lost key is replaced, not recovered."""

    list_display = ["name", "prefix", "active", "model_names", "created_at"]
    list_filter = ["active"]
    search_fields = ["name", "prefix"]
    readonly_fields = ["prefix", "created_at"]
    filter_horizontal = ["models"]
    fields = ["name", "active", "models", "prefix", "created_at"]

    @admin.display(description="models")
    def model_names(self, obj):
        return ", ".join(m.name for m in obj.models.all()) or "every model"

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("models")

    def save_model(self, request, obj, form, change):
        if not change:
            key = KEY_PREFIX + secrets.token_urlsafe(32)
            obj.prefix, obj.key_hash = key[:12], hash_key(key)
            super().save_model(request, obj, form, change)
            messages.warning(request, f"The API key for “{obj.name}” is {key} — copy it now: it is not shown again.")
            return
        super().save_model(request, obj, form, change)
