"""API keys for the OpenAI-compatible router."""

import hashlib
import secrets

from django.db import models as m

KEY_PREFIX = "llmgw-"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKey(m.Model):
    """A key a client sends as `Authorization: Bearer …`; only its hash is kept."""

    name = m.CharField(max_length=100, unique=True)
    prefix = m.CharField(max_length=16, editable=False, help_text="the key's first characters, to recognise it")
    key_hash = m.CharField(max_length=64, unique=True, editable=False)
    models = m.ManyToManyField("catalog.Model", blank=True, related_name="+", help_text="empty: every model")
    active = m.BooleanField(default=True)
    created_at = m.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "API key"

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, name: str) -> tuple["ApiKey", str]:
        """A new key: the row, and the key itself, which is shown once and never stored."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        return cls.objects.create(name=name, prefix=key[:12], key_hash=hash_key(key)), key
