class EngineFailed(Exception):
    """An engine did not come up: why, and its last log lines."""

    def __init__(self, reason: str, log_tail: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail

    def __str__(self):
        return f"{self.reason}\n{self.log_tail}".strip()
