from django.apps import AppConfig


class CatalogConfig(AppConfig):
    name = "catalog"
    verbose_name = "Catalog"

    def ready(self):
        from django.db.models.signals import post_delete, post_save

        from . import models
        from .plan_inputs import catalog_changed

        # Whatever a plan is made from: a write to any of these drops every process's kept inputs.
        for sender in (models.Model, models.Profile, models.GPUClass, models.Node, models.Replica, models.OriginFile):
            post_save.connect(catalog_changed, sender=sender, dispatch_uid=f"llmgw-catalog-save-{sender.__name__}")
            post_delete.connect(catalog_changed, sender=sender, dispatch_uid=f"llmgw-catalog-delete-{sender.__name__}")
